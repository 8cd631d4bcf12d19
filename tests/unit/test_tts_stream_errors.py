"""`/v1/stream/tts`: an engine's own error fails its request, not the connection."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator
from typing import Any, cast

import numpy as np

from services.common.audio.pcm import AudioF32
from services.common.errors import VoiceAgentError
from services.common.protocol.events import Speak
from services.common.service.ws import Channel
from services.tts.stream import TtsStream
from services.tts.synthesizer import Synthesizer


class _Synthesizer:
    """Speaks 10 ms of silence, but raises what an engine's C code raises on "boom"."""

    def request(self, text: str, voice: str | None, asked: Any) -> str:
        return text

    async def stream(self, text: str, rate: int, tenant: str) -> AsyncGenerator[AudioF32, None]:
        if text == "boom":
            raise ValueError("embedded null character")
        yield np.zeros(rate // 100, np.float32)


class _Channel:
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    async def send(self, event: Any) -> None:
        self.events.append((event.type, event.id))

    async def send_audio(self, pcm: bytes) -> None:
        self.events.append(("audio", len(pcm)))

    async def send_error(
        self, exc: VoiceAgentError, request_id: str | None = None, fatal: bool | None = None
    ) -> None:
        self.events.append(("error", (exc.code, exc.message, request_id, fatal)))


async def test_an_engine_error_fails_its_request_and_the_next_is_spoken() -> None:
    channel = _Channel()
    stream = TtsStream(
        cast(Channel, channel), cast(Synthesizer, _Synthesizer()), 16000, max_input_chars=100
    )
    for request_id, text in (("a", "boom"), ("b", "fine")):
        stop = asyncio.Event()
        stream.stops.setdefault(request_id, deque()).append(stop)
        stream.requests.put_nowait((Speak(type="speak", id=request_id, text=text), stop))
    speaker = asyncio.create_task(stream.speak())
    async with asyncio.timeout(5):
        while ("audio.done", "b") not in channel.events:
            await asyncio.sleep(0.01)
    speaker.cancel()
    await asyncio.gather(speaker, return_exceptions=True)
    assert channel.events == [
        ("audio.start", "a"),
        ("error", ("internal", "internal error (ValueError)", "a", False)),
        ("audio.start", "b"),
        ("audio", 320),
        ("audio.done", "b"),
    ]
    assert not stream.stops  # both requests are over
