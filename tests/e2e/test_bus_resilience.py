"""The bus rides out what a real Redis answers in a failover or to a bad job (real Redis):

- a demoted master (REPLICAOF, a planned CLUSTER FAILOVER) answers the gateway's blocked
  XREAD with `UNBLOCKED`: the result reader goes on;
- a Redis that came back empty numbers results by its own clock, maybe behind the reader's
  cursor: the reader starts over instead of skipping them; the turns' jobs it lost (not
  yet answered, nor cancelled) are submitted again;
- a job whose `reply_to` names a key of another type (WRONGTYPE) is answered failed and
  acknowledged, not retried as if Redis were down; dead-lettering one never strands the
  other jobs claimed with it;
- consumers do not pile up in a group: a drained worker deletes its own, `reclaim` sweeps
  those idle long with nothing pending.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from services.common.bus.connection import REDIS_FAILED, connect
from services.common.bus.keys import Keys
from services.common.bus.messages import AsrResult, TtsJob
from services.common.bus.settings import RedisSettings
from services.common.bus.streams import Delivery, JobStream, publish
from services.common.bus.worker import JobWorker
from services.common.service.lifecycle import Background
from services.gateway.bus import GatewayBus
from services.ops.redis_server import free_port, start_redis
from tests.conftest import RedisProc


async def until(check: Callable[[], Awaitable[bool]], within_s: float = 15.0) -> None:
    """Wait until `check()` holds (a bound only against a hang, never a timing claim)."""
    async with asyncio.timeout(within_s):
        while not await check():
            await asyncio.sleep(0.02)


def result(text: str) -> dict[bytes, bytes]:
    meta = AsrResult(job_id=text, session_id="s", utterance_id="u", text=text).dump()
    return {b"meta": meta}


class Reader:
    """A gateway's result reader run as the gateway runs it, and what it delivered."""

    def __init__(self, redis: Redis, settings: RedisSettings) -> None:
        self.bus = GatewayBus(redis, settings, "gw")
        self.got: list[str] = []
        self.background = Background()
        self.task = self.background.start(
            self.bus.route_results(lambda r, _: self.got.append(getattr(r, "text", ""))),
            "gateway-results",
        )

    async def delivered(self, text: str) -> None:
        async def seen() -> bool:
            assert not self.task.done(), "the result reader died"
            return text in self.got

        await until(seen)


async def _blocked_in_xread(admin: Redis) -> bool:
    clients: Any = await admin.client_list()
    return any(c.get("cmd") == "xread" and "b" in c.get("flags", "") for c in clients)


async def test_a_demoted_master_does_not_kill_the_result_reader(tmp_path: Path) -> None:
    """REPLICAOF (what a graceful failover does to the old master) unblocks the reader's
    XREAD with `-UNBLOCKED`; the reader backs off and reads the results sent after."""
    port = free_port()
    proc = start_redis(port, tmp_path)
    settings = RedisSettings(url=f"redis://127.0.0.1:{port}/0", prefix="demoted", block_ms=5000)
    redis, admin = connect(settings), connect(settings)
    reader = Reader(redis, settings)
    try:
        await publish(admin, settings, reader.bus.reply_to, result("before"))
        await reader.delivered("before")
        await until(lambda: _blocked_in_xread(admin))
        await admin.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))  # no one there
        await admin.execute_command("REPLICAOF", "NO", "ONE")
        await publish(admin, settings, reader.bus.reply_to, result("after"))
        await reader.delivered("after")
    finally:
        await reader.background.stop()
        await redis.aclose()
        await admin.aclose()
        proc.terminate()
        proc.wait(10)


async def test_results_after_redis_came_back_empty_with_a_clock_behind(tmp_path: Path) -> None:
    """The old server numbered results a minute ahead (its clock); the new one starts empty
    (no persistence) with ids behind the reader's cursor: they are read all the same."""
    port = free_port()
    proc = start_redis(port, tmp_path)
    settings = RedisSettings(url=f"redis://127.0.0.1:{port}/0", prefix="skew", block_ms=300)
    redis, writer = connect(settings), connect(settings)
    reader = Reader(redis, settings)
    try:
        ahead = f"{int(time.time() * 1000) + 60_000}-0"
        await writer.xadd(reader.bus.reply_to, result("old"), id=ahead)  # type: ignore[arg-type]
        await reader.delivered("old")
        proc.terminate()
        proc.wait(10)
        proc = start_redis(port, tmp_path)  # empty
        await publish(writer, settings, reader.bus.reply_to, result("new"))
        await reader.delivered("new")
        assert reader.got == ["old", "new"]
    finally:
        await reader.background.stop()
        await redis.aclose()
        await writer.aclose()
        proc.terminate()
        proc.wait(10)


async def test_a_result_stream_rewritten_behind_the_cursor_is_read_again(
    redis_server: RedisProc,
) -> None:
    """Without any error: the stream is replaced (a replica promoted without it) while the
    reader waits; the read comes back empty, the cursor is checked and set back."""
    settings = redis_server.settings(block_ms=200)
    redis, writer = connect(settings), connect(settings)
    reader = Reader(redis, settings)
    try:
        ahead = f"{int(time.time() * 1000) + 60_000}-0"
        await writer.xadd(reader.bus.reply_to, result("old"), id=ahead)  # type: ignore[arg-type]
        await reader.delivered("old")
        await writer.delete(reader.bus.reply_to)
        await publish(writer, settings, reader.bus.reply_to, result("new"))
        await reader.delivered("new")
    finally:
        await reader.background.stop()
        await redis.aclose()
        await writer.aclose()


def speech(job_id: str, response_id: str, reply_to: str) -> TtsJob:
    return TtsJob(
        job_id=job_id,
        session_id="s",
        response_id=response_id,
        seq=0,
        text="Hello.",
        voice="v",
        sample_rate=16000,
        reply_to=reply_to,
    )


async def _job_ids(redis: Redis, stream: str) -> list[str]:
    entries: Any = await redis.xrange(stream)
    return [json.loads(fields[b"meta"])["job_id"] for _, fields in entries]


async def test_the_turns_jobs_a_redis_lost_are_submitted_again(tmp_path: Path) -> None:
    """Three TTS jobs in flight: one answered, one cancelled, one waiting. Redis comes back
    empty: the waiting one is submitted again, alone; once answered, the next empty Redis
    gets nothing again."""
    port = free_port()
    proc = start_redis(port, tmp_path)
    settings = RedisSettings(url=f"redis://127.0.0.1:{port}/0", prefix="lost", block_ms=300)
    redis, writer = connect(settings), connect(settings)
    reader = Reader(redis, settings)
    stream = reader.bus.keys.job_shards("tts")[0]
    jobs = {n: speech(n, f"resp_{n}", reader.bus.reply_to) for n in ("done", "gone", "waiting")}
    try:
        for job in jobs.values():
            await reader.bus.submit_tts(job)
        answered = jobs["done"].done(1, 200, "completed").dump()
        await publish(writer, settings, reader.bus.reply_to, {b"meta": answered})
        await publish(writer, settings, reader.bus.reply_to, result("answered"))
        await reader.delivered("answered")
        await reader.bus.cancel("resp_gone")
        assert await _job_ids(writer, stream) == ["done", "gone", "waiting"]
        for restart in (1, 2):
            proc.terminate()
            proc.wait(10)
            proc = start_redis(port, tmp_path)  # empty
            if restart == 1:

                async def sent_again() -> bool:
                    return await _job_ids(writer, stream) == ["waiting"]

                await until(sent_again)
                answer = jobs["waiting"].done(1, 200, "completed").dump()
                await publish(writer, settings, reader.bus.reply_to, {b"meta": answer})
            # a result read after the outage: the reader has looked for lost jobs before it
            await publish(writer, settings, reader.bus.reply_to, result(f"after {restart}"))
            await reader.delivered(f"after {restart}")
        assert await _job_ids(writer, stream) == []
    finally:
        await reader.background.stop()
        await redis.aclose()
        await writer.aclose()
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize("how", ["flush", "restart"])
async def test_a_busy_gateway_looks_for_lost_jobs_too(tmp_path: Path, how: str) -> None:
    """Other sessions' results every 100 ms: no read comes back empty, and the client's own
    retries may hide the outage from the reader (a FLUSHALL never reaches it as an error).
    The waiting job is submitted again all the same (`LOST_CHECK_S`)."""
    port = free_port()
    proc = start_redis(port, tmp_path)
    settings = RedisSettings(url=f"redis://127.0.0.1:{port}/0", prefix="busy", block_ms=300)
    redis, writer = connect(settings), connect(settings)
    reader = Reader(redis, settings)
    stream = reader.bus.keys.job_shards("tts")[0]
    stop = asyncio.Event()

    async def traffic() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            with contextlib.suppress(*REDIS_FAILED):
                await publish(writer, settings, reader.bus.reply_to, result(f"other {n}"))
            await asyncio.sleep(0.1)

    busy = asyncio.create_task(traffic())
    try:
        await reader.bus.submit_tts(speech("waiting", "resp_w", reader.bus.reply_to))
        await reader.delivered("other 3")
        if how == "flush":
            await writer.flushall()
        else:
            proc.terminate()
            proc.wait(10)
            proc = start_redis(port, tmp_path)  # empty

        async def sent_again() -> bool:
            return await _job_ids(writer, stream) == ["waiting"]

        await until(sent_again)
    finally:
        stop.set()
        await busy
        await reader.background.stop()
        await redis.aclose()
        await writer.aclose()
        proc.terminate()
        proc.wait(10)


async def test_a_running_jobs_entry_trimmed_from_its_stream_is_not_lost(
    redis_server: RedisProc,
) -> None:
    """`MAXLEN ~` trims whole nodes, entries still pending too: a job a worker is running
    whose entry went is not submitted again (it would run twice)."""
    settings = redis_server.settings(block_ms=300, job_stream_maxlen=100)
    redis, writer = connect(settings), connect(settings)
    bus = GatewayBus(redis, settings, "gw")
    stream = bus.keys.job_shards("tts")[0]
    worker = JobStream(writer, settings, stream, "tts", "w1")
    others = JobStream(writer, settings, stream, "tts", "gw2")
    try:
        await worker.ensure_group()
        await bus.submit_tts(speech("long", "resp_long", bus.reply_to))
        assert len(await worker.read(1, block_ms=100)) == 1  # a worker runs it
        for n in range(300):  # other sessions' speech on the same shard
            await others.submit({b"meta": speech(f"other{n}", f"r{n}", "elsewhere").dump()})
        assert "long" not in await _job_ids(writer, stream)  # trimmed while it runs
        assert await bus.resubmit_lost() == 0
        assert "long" not in await _job_ids(writer, stream)
    finally:
        await redis.aclose()
        await writer.aclose()


def owned(job_id: str, reply_to: str) -> dict[bytes, bytes]:
    return {b"meta": json.dumps({"job_id": job_id, "session_id": "s", "reply_to": reply_to})}


async def test_a_job_whose_reply_to_is_not_a_stream_is_failed_and_acknowledged(
    redis_server: RedisProc,
) -> None:
    """Publishing its result meets WRONGTYPE: a refusal every retry would meet, not Redis
    down. The job is acknowledged at once, run once, and the healthy job after it runs."""
    settings = redis_server.settings(claim_idle_ms=1000)
    keys = Keys(settings.prefix)
    redis = connect(settings)
    stream, bad, good = keys.jobs("asr"), f"{settings.prefix}:not-a-stream", keys.results("gw")
    await redis.set(bad, b"x")
    ran: list[str] = []

    async def answer(delivery: Delivery) -> None:
        meta = json.loads(delivery.fields[b"meta"])
        ran.append(meta["job_id"])
        await publish(redis, settings, meta["reply_to"], result(meta["job_id"]))

    jobs = JobStream(redis, settings, stream, "asr", "w")
    worker = JobWorker(jobs, keys, answer, 4)
    await jobs.ensure_group()
    await jobs.submit(owned("poison", bad))
    await jobs.submit(owned("healthy", good))
    task = asyncio.create_task(worker.run())
    try:

        async def settled() -> bool:
            return await redis.xlen(good) == 1 and await jobs.pending_count() == 0

        await until(settled)
        assert sorted(ran) == ["healthy", "poison"]
        assert await redis.xlen(jobs.dead_stream) == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await redis.aclose()


async def test_dead_lettering_a_job_its_owner_cannot_hear_strands_nothing(
    redis_server: RedisProc,
) -> None:
    """One XAUTOCLAIM batch: a job past `max_deliveries` whose owner's stream is a key of
    another type, and a healthy job of a dead worker. The first is dead-lettered once and
    acknowledged; the second is handed over to run."""
    settings = redis_server.settings(max_deliveries=2)
    keys = Keys(settings.prefix)
    redis = connect(settings)
    stream, bad = keys.jobs("tts"), f"{settings.prefix}:not-a-stream"
    await redis.set(bad, b"x")
    dead = JobStream(redis, settings, stream, "tts", "dead-worker")
    await dead.ensure_group()
    poison = await dead.submit(owned("poison", bad))
    healthy = await dead.submit(owned("healthy", keys.results("gw")))
    assert len(await dead.read(10, block_ms=100)) == 2
    # idle past any claim_idle_ms, the poison delivered past max_deliveries (no waiting)
    await redis.xclaim(stream, "tts", "dead-worker", 0, [poison], idle=600_000, retrycount=5)
    await redis.xclaim(stream, "tts", "dead-worker", 0, [healthy], idle=600_000, retrycount=1)
    live = JobStream(redis, settings, stream, "tts", "live-worker")
    try:
        claimed = await live.reclaim(10)
        assert [d.entry_id for d in claimed] == [healthy]
        rows = await redis.xpending_range(stream, "tts", min="-", max="+", count=10)
        assert [r["message_id"] for r in rows] == [healthy]
        assert await redis.xlen(live.dead_stream) == 1
        assert await live.reclaim(10) == []  # nothing comes back: no second dead copy
        assert await redis.xlen(live.dead_stream) == 1
    finally:
        await redis.aclose()


async def _consumers(redis: Redis, stream: str, group: str) -> list[bytes]:
    rows: Any = await redis.xinfo_consumers(stream, group)
    return sorted(bytes(row["name"]) for row in rows)


async def test_a_drained_worker_deletes_its_consumer(redis_server: RedisProc) -> None:
    settings = redis_server.settings(block_ms=100)
    keys = Keys(settings.prefix)
    redis = connect(settings)
    stream = keys.jobs("asr")
    done = asyncio.Event()

    async def answer(_: Delivery) -> None:
        done.set()

    worker = JobWorker(JobStream(redis, settings, stream, "asr", "leaving"), keys, answer, 2)
    await worker.jobs.ensure_group()
    await worker.jobs.submit(owned("j", keys.results("gw")))
    task = asyncio.create_task(worker.run())
    try:
        async with asyncio.timeout(15):
            await done.wait()
        await until(lambda: _nothing_pending(worker.jobs))
        assert await _consumers(redis, stream, "asr") == [b"leaving"]
        await worker.drain(10.0)
        async with asyncio.timeout(15):
            await task
        assert await _consumers(redis, stream, "asr") == []
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await redis.aclose()


async def _nothing_pending(jobs: JobStream) -> bool:
    return await jobs.pending_count() == 0


async def test_reclaim_sweeps_consumers_long_idle_with_nothing_pending(
    redis_server: RedisProc,
) -> None:
    """A cancelled (or killed) worker's consumer with nothing pending goes; one holding a
    pending job stays (deleting it would drop the job from the pending list)."""
    settings = redis_server.settings()
    keys = Keys(settings.prefix)
    redis = connect(settings)
    stream = keys.jobs("tts")
    idle = JobStream(redis, settings, stream, "tts", "gone-idle")
    holding = JobStream(redis, settings, stream, "tts", "gone-holding")
    await idle.ensure_group()
    assert await idle.read(10, block_ms=10) == []  # registers the consumer, takes nothing
    await holding.submit(owned("j", keys.results("gw")))
    assert len(await holding.read(10, block_ms=100)) == 1
    sweeper = JobStream(redis, settings, stream, "tts", "sweeper", stale_consumer_ms=1)

    async def idle_past_a_millisecond() -> bool:
        rows: Any = await redis.xinfo_consumers(stream, "tts")
        return all(row["idle"] >= 1 for row in rows)

    try:
        await until(idle_past_a_millisecond)
        await sweeper.reclaim(10)
        names = await _consumers(redis, stream, "tts")
        assert b"gone-idle" not in names and b"gone-holding" in names
    finally:
        await redis.aclose()
