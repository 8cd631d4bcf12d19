"""The single door to the TTS engine: bounded concurrency, streaming, cancellation.

The engine runs in a worker thread and hands chunks over a small bounded queue
(backpressure); the caller gets chunks resampled to the rate it asked for and cut
to `chunk_ms`, and may stop between chunks: the thread stops at its next chunk (an
engine that polls `SpeechRequest.should_stop`, like chatterbox, stops sooner).

Voices: `default` and OpenAI's names map to the engine's default voice; a library
voice id (`v_...`, see voices.py) is looked up in the library when it is spoken, so
a voice deleted on any host is refused everywhere; other names are engine voices.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import AsyncGenerator
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
_END: Final = object()


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
        """Yield chunks of `chunk_ms` at `sample_rate`, in a voice `tenant` may use. Stop
        iterating to cancel."""
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
        self.active += 1
        try:
            async for chunk in self._run(request, sample_rate):
                yield chunk
        finally:
            self.active -= 1
            self._slots.release()

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

    async def _run(
        self, request: SpeechRequest, sample_rate: int
    ) -> AsyncGenerator[AudioF32, None]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[object] = asyncio.Queue(maxsize=4)
        stop = threading.Event()
        request = dataclasses.replace(request, should_stop=stop.is_set)

        def produce() -> None:
            try:
                for chunk in self.engine.synthesize(request):
                    if stop.is_set():
                        return
                    asyncio.run_coroutine_threadsafe(queue.put(chunk), loop).result()
            except BaseException as exc:
                asyncio.run_coroutine_threadsafe(queue.put(exc), loop).result()
            finally:
                if not stop.is_set():
                    asyncio.run_coroutine_threadsafe(queue.put(_END), loop).result()

        started = time.perf_counter()
        worker = loop.run_in_executor(None, produce)
        resampler = StreamResampler(self.engine.sample_rate, sample_rate)
        size = ms_to_samples(self.chunk_ms, sample_rate)
        pending = np.zeros(0, dtype=np.float32)
        total = 0
        try:
            while True:
                item = await queue.get()
                if item is _END:
                    break
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, np.ndarray)
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
                total += tail.size
                yield tail
            if total:
                seconds = total / sample_rate
                TTS_AUDIO_SECONDS.inc(seconds)
                TTS_RTF.observe((time.perf_counter() - started) / seconds)
        finally:
            stop.set()
            while not queue.empty():  # room for the producer's last put, then it sees `stop`
                queue.get_nowait()
            await worker
