"""The single door to the TTS engine: bounded concurrency, streaming, cancellation.

The engine runs in a worker thread that holds one of `max_concurrent` synthesis slots
for exactly as long as it runs. It does not wait for its reader: its chunks go into the
request's own buffer (bounded by the request, whose text is at most `max_input_chars`),
so a client that reads slowly holds memory, never a slot. The caller gets chunks as soon
as the engine makes them, resampled to the rate it asked for and cut to `chunk_ms`.

Cancelling: stop iterating (close the stream), or abandon a step that waits for a slot or
for the engine's next piece (cancel the task running it; `until_stopped` does so when an
event is set). The stream then ends at once and tells the engine to stop: an engine that
polls `SpeechRequest.should_stop` (chatterbox before every token step, Piper and the fake
between pieces) stops at its next poll, any other at its next chunk; the slot comes back
when its thread ends.

Voices: `default` and OpenAI's names map to the engine's default voice; a library
voice id (`v_...`, see voices.py) is looked up in the library when it is spoken, so
a voice deleted on any host is refused everywhere; other names are engine voices.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, Iterator
from contextlib import aclosing
from typing import Final, Protocol

import numpy as np

from services.common.audio.pcm import AudioF32, StreamResampler, ms_to_samples
from services.common.errors import CapacityError, UnknownVoice
from services.common.tenancy import DEFAULT_TENANT
from services.common.text import speakable
from services.tts.engines.base import SpeechRequest, TtsEngine
from services.tts.metrics import TTS_AUDIO_SECONDS, TTS_FIRST_AUDIO, TTS_QUEUE_WAIT, TTS_RTF
from services.tts.voices import VoiceInfo, VoiceLibrary, is_library_id

OPENAI_VOICES: Final = frozenset(
    {
        "alloy",
        "ash",
        "ballad",
        "coral",
        "echo",
        "fable",
        "onyx",
        "nova",
        "sage",
        "shimmer",
        "verse",
        "marin",
        "cedar",
    }
)


class Styled(Protocol):
    """How a request asks to be spoken: the WebSocket `speak`, the REST body, a Redis job."""

    @property
    def speed(self) -> float: ...
    @property
    def exaggeration(self) -> float | None: ...
    @property
    def cfg_weight(self) -> float | None: ...
    @property
    def temperature(self) -> float | None: ...


class Synthesizer:
    """Streams speech for many requests, at most `max_concurrent` synthesizing at once."""

    def __init__(
        self,
        engine: TtsEngine,
        max_concurrent: int,
        max_queue: int,
        chunk_ms: int,
        library: VoiceLibrary | None = None,
    ):
        self.engine = engine
        self.library = library
        self.max_queue = max_queue
        self.chunk_ms = chunk_ms
        self._slots = asyncio.Semaphore(max_concurrent)
        self.waiting = 0
        self.active = 0
        """Engine threads running (each holds a slot), whether or not anyone still reads."""

    def depth(self) -> int:
        """Requests waiting for a synthesis slot."""
        return self.waiting

    def request(
        self, text: str, voice: str | None, asked: Styled, continues: bool = False
    ) -> SpeechRequest:
        """What to speak, in the resolved voice, with the style one of the doors asked for
        (`continues`: a gateway chunk that stops inside a sentence)."""
        return SpeechRequest(
            text=speakable(text),
            voice=self.resolve_voice(voice),
            speed=asked.speed,
            exaggeration=asked.exaggeration,
            cfg_weight=asked.cfg_weight,
            temperature=asked.temperature,
            continues=continues,
        )

    def resolve_voice(self, voice: str | None) -> str:
        """An engine voice id for a requested name.

        None, "default" and OpenAI's voice names map to the engine's default voice; a
        library id stays as it is (`stream` looks it up); other names must be voices the
        engine knows (else UnknownVoice, HTTP 400).
        """
        if voice is None or voice == "default" or voice.lower() in OPENAI_VOICES:
            return self.engine.default_voice
        if self.library is not None and is_library_id(voice):
            return voice
        if self.engine.has_voice(voice):
            return voice
        raise UnknownVoice(
            f"unknown voice {voice!r}; use 'default', an OpenAI voice name (mapped to the "
            "default voice) or one of GET /v1/voices"
        )

    async def check_voice(self, voice: str | None, tenant: str = DEFAULT_TENANT) -> None:
        """UnknownVoice now for a voice that nothing answers to (a library id included, or
        another tenant's), so a request is refused before any of its audio is announced."""
        resolved = self.resolve_voice(voice)
        if self.library is not None and is_library_id(resolved):
            await self._library_info(self.library, resolved, tenant)

    async def stream(
        self, request: SpeechRequest, sample_rate: int, tenant: str = DEFAULT_TENANT
    ) -> AsyncGenerator[AudioF32, None]:
        """Yield chunks of `chunk_ms` at `sample_rate`, in a voice `tenant` may use.

        Stop iterating to cancel, or cancel the task of a step that waits (for a slot, for
        the engine's next piece): either ends the stream at once and tells the engine to
        stop; the slot is given back when the engine's thread ends (see the module's doc)."""
        if self.waiting >= self.max_queue:
            raise CapacityError(f"TTS queue is full ({self.max_queue} waiting)", retry_after_s=1)
        request = await self._library_voice(request, tenant)
        self.waiting += 1
        arrived = time.perf_counter()
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        TTS_QUEUE_WAIT.observe(time.perf_counter() - arrived)
        synthesis = self._start(request)  # holds the slot until the engine's thread ends
        try:
            async with aclosing(self._chunks(synthesis, sample_rate)) as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            synthesis.halt()  # no wait: the reader is free now, the slot follows the thread

    async def _library_voice(self, request: SpeechRequest, tenant: str) -> SpeechRequest:
        """The request with a library voice id replaced by the engine voice speaking it."""
        if self.library is None or not is_library_id(request.voice):
            return request
        info = await self._library_info(self.library, request.voice, tenant)
        clip = await self.library.local_clip(info)
        voice = self.engine.library_voice(info.speaker(clip))
        return dataclasses.replace(request, voice=voice)

    @staticmethod
    async def _library_info(library: VoiceLibrary, voice_id: str, tenant: str) -> VoiceInfo:
        info = await library.get(voice_id, tenant)
        if info is None:
            raise UnknownVoice(
                f"unknown voice {voice_id!r}: it was deleted or never existed; see GET /v1/voices"
            )
        return info

    def _start(self, request: SpeechRequest) -> _Synthesis:
        """Run the engine on `request` in a worker thread that holds the slot just taken:
        released, with the synthesis ended, when the thread returns."""
        loop = asyncio.get_running_loop()
        synthesis = _Synthesis()
        request = dataclasses.replace(request, should_stop=synthesis.halted.is_set)
        engine = self.engine

        def produce() -> None:
            started = time.perf_counter()
            made = 0
            chunks = engine.synthesize(request)
            try:
                for chunk in chunks:
                    if synthesis.halted.is_set():
                        return
                    made += chunk.size
                    loop.call_soon_threadsafe(synthesis.push, chunk)
            finally:
                _close(chunks)
            if made:
                seconds = made / engine.sample_rate
                TTS_AUDIO_SECONDS.inc(seconds)
                TTS_RTF.observe((time.perf_counter() - started) / seconds)

        def finished(worker: asyncio.Future[None]) -> None:
            self.active -= 1
            self._slots.release()
            synthesis.end(None if worker.cancelled() else worker.exception())

        self.active += 1
        try:
            worker = loop.run_in_executor(None, produce)
        except BaseException:
            self.active -= 1
            self._slots.release()
            raise
        worker.add_done_callback(finished)
        return synthesis

    async def _chunks(
        self, synthesis: _Synthesis, sample_rate: int
    ) -> AsyncGenerator[AudioF32, None]:
        """The engine's chunks as they come, resampled to `sample_rate`, cut to `chunk_ms`."""
        started = time.perf_counter()
        resampler = StreamResampler(self.engine.sample_rate, sample_rate)
        size = ms_to_samples(self.chunk_ms, sample_rate)
        pending = np.zeros(0, dtype=np.float32)
        total = 0
        while (item := await synthesis.next()) is not None:
            pending = np.concatenate([pending, resampler.process(item)])
            while pending.size >= size:
                if total == 0:
                    TTS_FIRST_AUDIO.observe(time.perf_counter() - started)
                chunk, pending = pending[:size], pending[size:]
                total += chunk.size
                yield chunk
        tail = np.concatenate([pending, resampler.process(np.zeros(0, np.float32), last=True)])
        if tail.size:
            if total == 0:
                TTS_FIRST_AUDIO.observe(time.perf_counter() - started)
            yield tail


class _Synthesis:
    """One request's engine output, handed from the worker thread to the event loop.

    Chunks are kept until read: never more than the request's own audio, and nothing for a
    reader that keeps up. `halted` tells the engine (its `should_stop`) to stop."""

    def __init__(self) -> None:
        self.halted = threading.Event()
        self._chunks: deque[AudioF32] = deque()
        self._ended = False
        self._error: BaseException | None = None
        self._changed = asyncio.Event()

    def push(self, chunk: AudioF32) -> None:
        """A chunk from the engine (on the event loop)."""
        if not self.halted.is_set():
            self._chunks.append(chunk)
            self._changed.set()

    def end(self, error: BaseException | None) -> None:
        """The engine's thread returned (on the event loop), with the engine's error if any."""
        self._ended = True
        self._error = error
        self._changed.set()

    def halt(self) -> None:
        """No one reads any more: the engine stops at its next poll, its chunks are dropped."""
        self.halted.set()
        self._chunks.clear()

    async def next(self) -> AudioF32 | None:
        """The next chunk; None at the end; the engine's error once its chunks are read."""
        while not self._chunks:
            if self._ended:
                if self._error is not None:
                    raise self._error
                return None
            self._changed.clear()
            await self._changed.wait()
        return self._chunks.popleft()


def _close(chunks: Iterator[AudioF32]) -> None:
    """Close an engine's iterator (a generator's `finally` runs now, in this thread)."""
    close = getattr(chunks, "close", None)
    if close is not None:
        close()


async def until_stopped(
    chunks: AsyncGenerator[AudioF32, None], stop: asyncio.Event
) -> AsyncGenerator[AudioF32, None]:
    """`chunks` until `stop` is set, which ends this at once even while a step of `chunks`
    waits (for a slot, for the engine's next piece): that step is abandoned (its task
    cancelled, which ends `chunks` and tells the engine to stop). Nothing comes out once
    `stop` is set, not even an error that the abandoned step met meanwhile."""
    stopped = asyncio.ensure_future(stop.wait())
    step: asyncio.Future[AudioF32 | None] | None = None
    try:
        while not stop.is_set():
            step = asyncio.ensure_future(anext(chunks, None))
            await asyncio.wait({step, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if stop.is_set():
                break
            chunk = step.result()
            if chunk is None:
                return
            yield chunk
    finally:
        stopped.cancel()
        if step is not None and not step.done():
            step.cancel()
            await asyncio.wait({step})  # its cancellation runs the stream's `finally`
        if step is not None and step.done() and not step.cancelled():
            step.exception()  # retrieved: a stopped stream's last error is not reported
        await chunks.aclose()
