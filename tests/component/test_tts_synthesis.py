"""The Synthesizer's slots and cancellation, and the Redis door's cancel (services/tts/).

A slot is held by the engine's thread, not by the reader: a reader that stops reading holds
its request's audio in memory, never a slot. A cancel ends a stream at once, while the
engine is still in the middle of a piece, and tells the engine to stop; the slot comes
back when the engine's thread ends. `GatedEngine` stands for an engine whose piece takes as
long as the test says: the tests wait on events, never on a clock (the timeouts only turn a
hang into a failure).
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np

from services.common.bus.connection import connect
from services.common.bus.keys import Keys
from services.common.bus.messages import TtsJob
from services.common.bus.streams import CancelWatch, Delivery, cancel
from services.tts.consumer import TtsJobHandler
from services.tts.engines.base import AudioF32, SpeechRequest
from services.tts.engines.fake import FakeTtsEngine
from services.tts.settings import FakeTtsSettings
from services.tts.synthesizer import Synthesizer, until_stopped
from tests.conftest import RedisProc

RATE = 24000
PIECE = RATE // 5
"""One piece of GatedEngine: 200 ms, one chunk of the Synthesizer's `chunk_ms` below."""
CHUNK_MS = 200
GUARD_S = 20
"""Only turns a hang (the bug) into a failure: every wait below ends on an event."""


class GatedEngine(FakeTtsEngine):
    """The fake engine's tone, except for a text that starts with "gated": one piece, then
    a second piece that lasts until `release` is set (an engine in the middle of a long
    piece: it does not poll `should_stop` meanwhile, as Piper's ONNX call does not). Once
    that piece is done it polls `should_stop`, as Piper and chatterbox do before going on,
    and notes what it said; not stopped, it speaks two more pieces."""

    def __init__(self) -> None:
        super().__init__(FakeTtsSettings(ms_per_word=100, sample_rate=RATE), chunk_ms=CHUNK_MS)
        self.release = threading.Event()
        self.in_piece = threading.Event()
        """The gated piece has begun."""
        self.returned = threading.Event()
        """A gated synthesis has returned."""
        self.stop_seen: list[bool] = []
        """What `should_stop` said after each gated piece."""

    def synthesize(self, request: SpeechRequest) -> Iterator[AudioF32]:
        if not request.text.startswith("gated"):
            return super().synthesize(request)
        return self._gated(request)

    def _gated(self, request: SpeechRequest) -> Iterator[AudioF32]:
        piece = np.full(PIECE, 0.1, np.float32)
        try:
            yield piece
            self.in_piece.set()
            if not self.release.wait(timeout=60):
                raise TimeoutError("the gated piece was never released")
            stopped = request.should_stop is not None and request.should_stop()
            self.stop_seen.append(stopped)
            if stopped:
                return
            for _ in range(3):
                yield piece
        finally:
            self.returned.set()


def _speech(text: str) -> SpeechRequest:
    return SpeechRequest(text=text, voice="fake")


async def wait_set(event: threading.Event) -> None:
    """Wait until an event of the engine's thread is set (without blocking the loop)."""
    async with asyncio.timeout(GUARD_S):
        while not await asyncio.to_thread(event.wait, 0.5):
            pass


# ---------------------------------------------------------------- slots


async def test_a_reader_that_stops_reading_holds_no_slot() -> None:
    """One slot; the first reader takes one chunk of a long request and reads no more.
    The second request is still served: the first one's synthesis ran ahead into its own
    buffer and gave the slot back when it ended (it used to wait on a 4-chunk queue for its
    reader, holding the slot for as long as the reader took)."""
    engine = FakeTtsEngine(FakeTtsSettings(ms_per_word=100, sample_rate=RATE), chunk_ms=20)
    synthesizer = Synthesizer(engine, max_concurrent=1, max_queue=4, chunk_ms=20)
    words = 60  # 6 s of tone in 300 engine chunks: far more than any hand-over queue
    slow = synthesizer.stream(_speech("word " * words), RATE)
    other = synthesizer.stream(_speech("hi there"), RATE)
    try:
        first = await anext(slow)
        async with asyncio.timeout(GUARD_S):
            served = [chunk async for chunk in other]
        assert sum(chunk.size for chunk in served) == engine.duration_samples("hi there")
        assert synthesizer.active == 0 and synthesizer.depth() == 0
        # the slow reader loses nothing: the rest of its request was kept for it
        rest = [chunk async for chunk in slow]
        total = first.size + sum(chunk.size for chunk in rest)
        assert total == engine.duration_samples("word " * words)
    finally:
        await slow.aclose()
        await other.aclose()


async def test_the_first_chunk_leaves_before_the_synthesis_ends() -> None:
    """Time to first audio is unchanged by running ahead: the first piece reaches the
    reader while the engine is still in its second one."""
    engine = GatedEngine()
    synthesizer = Synthesizer(engine, max_concurrent=1, max_queue=4, chunk_ms=CHUNK_MS)
    chunks = synthesizer.stream(_speech("gated words"), RATE)
    try:
        async with asyncio.timeout(GUARD_S):
            first = await anext(chunks)
        assert first.size == PIECE and not engine.returned.is_set()
        engine.release.set()
        rest = [chunk async for chunk in chunks]
        assert len(rest) == 3 and engine.stop_seen == [False]
    finally:
        engine.release.set()
        await chunks.aclose()


# ---------------------------------------------------------------- cancellation


async def test_a_stop_ends_the_stream_mid_piece_and_the_slot_follows_the_engine() -> None:
    """`until_stopped` ends the stream as soon as its event is set, while the engine is in
    the middle of a piece; the engine sees `should_stop` when that piece is done and makes
    no more. Its slot stays taken until then (the engine still works), then serves the next
    request."""
    engine = GatedEngine()
    synthesizer = Synthesizer(engine, max_concurrent=1, max_queue=4, chunk_ms=CHUNK_MS)
    stop = asyncio.Event()
    gated = until_stopped(synthesizer.stream(_speech("gated words"), RATE), stop)
    got: list[AudioF32] = []
    first = asyncio.Event()

    async def read() -> None:
        async for chunk in gated:
            got.append(chunk)
            first.set()

    reader = asyncio.create_task(read())
    waiting: asyncio.Task[list[AudioF32]] | None = None
    try:
        async with asyncio.timeout(GUARD_S):
            await first.wait()
        await wait_set(engine.in_piece)
        stop.set()
        async with asyncio.timeout(GUARD_S):
            await reader  # ends now, the engine's piece not done
        assert len(got) == 1 and not engine.returned.is_set()
        assert synthesizer.active == 1  # the engine's thread still holds the slot

        async def next_request() -> list[AudioF32]:
            return [chunk async for chunk in synthesizer.stream(_speech("hi"), RATE)]

        waiting = asyncio.create_task(next_request())
        async with asyncio.timeout(GUARD_S):
            while synthesizer.depth() != 1:
                await asyncio.sleep(0.01)  # polls a condition, asserts no time
        engine.release.set()
        await wait_set(engine.returned)
        assert engine.stop_seen == [True]
        async with asyncio.timeout(GUARD_S):
            served = await waiting
        assert sum(chunk.size for chunk in served) == engine.duration_samples("hi")
        assert len(got) == 1  # nothing came out after the stop
    finally:
        engine.release.set()
        reader.cancel()
        if waiting is not None:
            waiting.cancel()
        await gated.aclose()


# ---------------------------------------------------------------- the Redis door


class _Job:
    """A handler on a real Redis, and jobs of it (`job`, and more from `another`)."""

    def __init__(self, redis_server: RedisProc, engine: GatedEngine, slots: int = 1) -> None:
        self.settings = redis_server.settings()
        self.redis = connect(self.settings)
        self.keys = Keys(self.settings.prefix, self.settings.shards)
        synthesizer = Synthesizer(engine, max_concurrent=slots, max_queue=4, chunk_ms=CHUNK_MS)
        self.handler = TtsJobHandler(synthesizer, self.redis, self.settings, self.keys)
        self.job = self.another()

    def another(self) -> TtsJob:
        return TtsJob(
            job_id=f"job-{uuid.uuid4().hex[:8]}",
            session_id="s1",
            response_id=f"r-{uuid.uuid4().hex[:8]}",
            seq=0,
            text="gated words",
            voice="default",
            sample_rate=RATE,
            reply_to=f"{self.settings.prefix}:test:reply:{uuid.uuid4().hex[:8]}",
        )

    async def published(self, job: TtsJob | None = None) -> list[dict[str, Any]]:
        entries = await self.redis.xrange((job or self.job).reply_to)
        return [json.loads(fields[b"meta"]) for _, fields in entries]

    async def first_chunk(self, job: TtsJob | None = None) -> None:
        """Wait until the job's first chunk is published (a cancel from now on comes while
        the handler waits for the engine's next piece)."""
        async with asyncio.timeout(GUARD_S):
            while not await self.redis.xread({(job or self.job).reply_to: b"0"}, block=500):
                pass

    async def cancel(self, job: TtsJob | None = None) -> None:
        await cancel(self.redis, self.keys, self.settings, (job or self.job).response_id)


async def test_a_cancelled_job_ends_while_the_engine_is_mid_piece(
    redis_server: RedisProc,
) -> None:
    """The response is cancelled after its first chunk, while the engine is in its next
    piece: the job ends `cancelled` without waiting for that piece (it used to look for
    the cancel only after the engine's next chunk), the engine is told to stop, and
    nothing is published after the cancel."""
    engine = GatedEngine()
    job = _Job(redis_server, engine)
    job.handler.cancels.poll_s = 0.01
    speaking = asyncio.create_task(job.handler._speak(job.job))
    try:
        await job.first_chunk()
        await wait_set(engine.in_piece)
        await job.cancel()
        async with asyncio.timeout(GUARD_S):
            status = await speaking
        assert not engine.returned.is_set()  # ended with the engine mid-piece
        assert status == ("cancelled", 1, PIECE)
        engine.release.set()
        await wait_set(engine.returned)
        assert engine.stop_seen == [True]  # told to stop: made nothing more
        kinds = [meta["kind"] for meta in await job.published()]
        assert kinds == ["tts.chunk"]
    finally:
        engine.release.set()
        speaking.cancel()
        await job.redis.aclose()


async def test_a_cancel_stops_its_own_job_and_no_other(redis_server: RedisProc) -> None:
    """Two jobs of two responses run at once, both with the engine mid-piece; one response
    is cancelled. Its job ends `cancelled` and the other goes on to the end once the engine
    goes on: the jobs share one lookup of their cancellations, not its outcome."""
    engine = GatedEngine()
    job = _Job(redis_server, engine, slots=2)
    job.handler.cancels.poll_s = 0.01
    kept = job.another()
    speaking = asyncio.create_task(job.handler(_delivery(job.job)))
    going_on = asyncio.create_task(job.handler(_delivery(kept)))
    try:
        await job.first_chunk()
        await job.first_chunk(kept)
        await wait_set(engine.in_piece)
        await job.cancel()
        async with asyncio.timeout(GUARD_S):
            await speaking
        assert not going_on.done()  # still waiting for the engine
        engine.release.set()
        async with asyncio.timeout(GUARD_S):
            await going_on
        ended = (await job.published())[-1]
        assert (ended["kind"], ended["status"], ended["chunks"]) == ("tts.done", "cancelled", 1)
        ended = (await job.published(kept))[-1]
        assert (ended["kind"], ended["status"], ended["chunks"]) == ("tts.done", "completed", 4)
        assert job.handler.cancels._poller is not None
        async with asyncio.timeout(GUARD_S):  # nothing watched: the lookups end at once
            await job.handler.cancels._poller
    finally:
        engine.release.set()
        speaking.cancel()
        going_on.cancel()
        await job.redis.aclose()


async def test_one_lookup_covers_every_watched_response(redis_server: RedisProc) -> None:
    """Three responses watched, all cancelled before the first lookup: that one lookup
    sets all three (one round trip for all, not one per job), and no lookup follows while
    nothing watched is left unset. (A response never cancelled stays unset: the test
    above.)"""
    settings = redis_server.settings()
    redis = connect(settings)
    keys = Keys(settings.prefix, settings.shards)
    watch = CancelWatch(redis, keys, poll_s=0.01)
    try:
        for response_id in ("r1", "r2", "r3"):
            await cancel(redis, keys, settings, response_id)
        with (
            watch.watching("r1") as r1,
            watch.watching("r2") as r2,
            watch.watching("r3") as r3,
            watch.watching("r1") as r1_again,  # a second job of the same response
        ):
            async with asyncio.timeout(GUARD_S):
                await asyncio.gather(r1.wait(), r2.wait(), r3.wait())
            await asyncio.sleep(0.05)  # five more ticks, for a lookup that should not come
            assert watch.looks == 1 and r1_again is r1
    finally:
        await redis.aclose()


def _delivery(job: TtsJob) -> Delivery:
    return Delivery(entry_id=b"1-0", fields={b"meta": job.dump()})
