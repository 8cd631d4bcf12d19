"""`WS /v1/stream/tts`: text in, audio chunks out, requests served in order (docs/protocol.md)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from contextlib import aclosing

from fastapi import WebSocket

from services.common.audio.pcm import float_to_pcm16, samples_to_ms
from services.common.auth.credentials import app_subprotocol
from services.common.auth.guard import principal_of
from services.common.errors import CapacityError, InternalError, InvalidMessage, VoiceAgentError
from services.common.protocol.events import (
    TTS_CLIENT_EVENTS,
    AudioDone,
    AudioStart,
    CancelSpeak,
    Speak,
    TtsReady,
    parse,
)
from services.common.service.routes import ServiceState
from services.common.service.ws import Channel, Disconnected, failing_typed
from services.common.tenancy import DEFAULT_TENANT
from services.tts.metrics import TTS_CANCELLED
from services.tts.synthesizer import Synthesizer, until_stopped

log = logging.getLogger(__name__)

MAX_QUEUED = 32


class TtsStream:
    """One connection: a reader task takes requests, a speaker task serves them in order."""

    def __init__(
        self,
        channel: Channel,
        synthesizer: Synthesizer,
        default_rate: int,
        max_input_chars: int,
        tenant: str = DEFAULT_TENANT,
    ) -> None:
        self.tenant = tenant
        self.channel = channel
        self.synthesizer = synthesizer
        self.default_rate = default_rate
        self.max_input_chars = max_input_chars
        self.requests: asyncio.Queue[tuple[Speak, asyncio.Event]] = asyncio.Queue(MAX_QUEUED)
        """Requests to speak, each with its stop (a cancel of its id sets it)."""
        self.stops: dict[str, deque[asyncio.Event]] = {}
        """Per id, the stop of each of its requests queued or being spoken, oldest first
        (requests are served in order): a cancel sets the ones there are when it comes,
        never that of a request sent after it with the same id."""

    async def read(self) -> None:
        while True:
            frame = await self.channel.receive()
            request_id: str | None = None
            try:
                if frame.text is None:
                    raise InvalidMessage("this endpoint takes JSON text messages only")
                message = parse(TTS_CLIENT_EVENTS, frame.text)
                request_id = message.id
                if isinstance(message, CancelSpeak):
                    for stop in self.stops.get(message.id, ()):
                        stop.set()
                elif len(message.text) > self.max_input_chars:
                    raise InvalidMessage(f"text exceeds {self.max_input_chars} characters")
                elif self.requests.full():
                    raise CapacityError(f"more than {MAX_QUEUED} requests queued")
                else:
                    await self.synthesizer.check_voice(
                        message.voice, self.tenant
                    )  # fail early, by id
                    stop = asyncio.Event()
                    self.stops.setdefault(message.id, deque()).append(stop)
                    self.requests.put_nowait((message, stop))
            except VoiceAgentError as exc:  # one request refused; the connection goes on
                await self.channel.send_error(
                    exc, request_id or _claimed_id(frame.text), fatal=False
                )
            except Exception as exc:  # ours (Redis out of reach, a bug): this message fails
                log.exception("tts message %s failed", request_id)
                await self.channel.send_error(
                    InternalError.of(exc), request_id or _claimed_id(frame.text), fatal=False
                )

    async def speak(self) -> None:
        while True:
            request, stop = await self.requests.get()
            try:
                await self._speak_one(request, stop)
            except VoiceAgentError as exc:
                await self.channel.send_error(exc, request.id, fatal=False)
            except Disconnected:
                raise
            except Exception as exc:  # an engine's own error: this request fails, not the rest
                log.exception("tts request %s failed", request.id)
                await self.channel.send_error(InternalError.of(exc), request.id, fatal=False)
            finally:
                self._finished(request.id)

    def _finished(self, request_id: str) -> None:
        stops = self.stops.get(request_id)
        if stops:
            stops.popleft()
            if not stops:
                del self.stops[request_id]

    async def _speak_one(self, request: Speak, stop: asyncio.Event) -> None:
        """Speak one request; a cancel (`stop`) ends it at once, even while the engine is
        in the middle of a piece (the engine is told to stop and its slot follows)."""
        rate = request.sample_rate or self.default_rate
        await self.channel.send(AudioStart(id=request.id, sample_rate=rate))
        samples = 0
        speech = self.synthesizer.request(request.text, request.voice, request)
        if not stop.is_set():
            chunks = until_stopped(self.synthesizer.stream(speech, rate, self.tenant), stop)
            async with aclosing(chunks) as audio:
                async for chunk in audio:
                    await self.channel.send_audio(float_to_pcm16(chunk))
                    samples += chunk.size
        cancelled = stop.is_set()
        if cancelled:
            TTS_CANCELLED.inc()
        await self.channel.send(
            AudioDone(
                id=request.id,
                audio_ms=samples_to_ms(samples, rate),
                status="cancelled" if cancelled else "completed",
            )
        )


def _claimed_id(text: str | None) -> str | None:
    """The `id` a rejected message carried, so the client can match the error to its request
    (None when it carried none the protocol allows: a cut-down id would match nothing)."""
    try:
        raw = json.loads(text or "")
    except (ValueError, RecursionError):
        return None
    claimed = raw.get("id") if isinstance(raw, dict) else None
    return claimed if isinstance(claimed, str) and 1 <= len(claimed) <= 128 else None


async def serve_tts_stream(
    ws: WebSocket,
    state: ServiceState,
    synthesizer: Synthesizer,
    default_rate: int,
    max_frame_bytes: int,
    max_input_chars: int,
) -> None:
    """Accept and serve one connection (the guard has checked its credential)."""
    await ws.accept(subprotocol=app_subprotocol(ws.scope.get("subprotocols")))
    channel = Channel(ws, "tts", max_frame_bytes)
    state.connection_opened()
    tenant = principal_of(ws).tenant
    stream = TtsStream(channel, synthesizer, default_rate, max_input_chars, tenant)
    try:
        async with failing_typed(channel.fail, "TTS stream"):
            await channel.send(TtsReady())
            async with asyncio.TaskGroup() as tasks:
                speaker = tasks.create_task(stream.speak(), name="tts-speaker")
                try:
                    await stream.read()
                finally:
                    speaker.cancel()
    finally:
        state.connection_closed()
        await channel.close(1000)
