"""`/v1/realtime`: the OpenAI Realtime API as an adapter over `/v1/stream`'s Session.

`RealtimeChannel` is a `Channel`: the Session reads native frames from it and sends
native events to it, exactly as on `/v1/stream`. Inbound, each OpenAI client event
becomes native frames (base64 audio → PCM16 binary frames of at most 1 s; text items
→ `conversation.text`); outbound, each native event becomes the OpenAI events a client
expects (GA names; beta names when the client sends `OpenAI-Beta: realtime=v1`). No
second pipeline: turns, barge-in, ASR/TTS jobs and pacing are the Session's own.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from starlette.websockets import WebSocket

from services.common import metrics
from services.common.audio.vad import VadSettings
from services.common.errors import InvalidAudio, VoiceAgentError
from services.common.protocol.events import (
    ErrorEvent,
    Event,
    OutputAudioClear,
    ResponseAudioDone,
    ResponseCreated,
    ResponseDone,
    ResponseTextDelta,
    SessionConfig,
    SessionCreated,
    SessionUpdated,
    SpeechStarted,
    SpeechStopped,
    TranscriptFinal,
    TranscriptPartial,
)
from services.common.service.ws import Channel, Frame
from services.gateway import realtime_events as rt
from services.gateway import realtime_shapes as shapes

REALTIME_SESSION: dict[str, object] = {"input_sample_rate": 24000, "output_sample_rate": 24000}
"""A `/v1/realtime` session starts with OpenAI's formats: PCM16 at 24 kHz both ways."""


@dataclass
class _Reply:
    """The assistant item of the response under way."""

    id: str
    item_id: str
    transcript: list[str] = field(default_factory=list)
    client_cancelled: bool = False


class RealtimeChannel(Channel):
    """A WebSocket speaking OpenAI Realtime events to the client, native ones to the Session."""

    def __init__(
        self,
        ws: WebSocket,
        max_frame_bytes: int,
        beta: bool = False,
        vad: VadSettings | None = None,
    ) -> None:
        super().__init__(ws, "gateway", max_frame_bytes)
        self.beta = beta
        self.vad = vad or VadSettings()
        self.config: SessionConfig | None = None
        self._ready: deque[Frame] = deque()
        self._client_event: str | None = None  # event_id of the client event being handled
        self._open_item: str | None = None  # the user's utterance the VAD has open
        self._last_item: str | None = None
        self._texts: list[str] = []  # user text items waiting for response.create
        self._partials: dict[str, str] = {}
        self._reply: _Reply | None = None
        self._answering_commit = False  # a manual commit's turn will be answered by itself

    # ------------------------------------------------------------ client → Session

    async def receive(self) -> Frame:
        while not self._ready:
            frame = await super().receive()
            if frame.data is not None:
                return frame  # raw PCM16 at the input rate: a shortcut, as on /v1/stream
            try:
                await self._translate(frame.text or "")
            except VoiceAgentError as exc:
                if exc.fatal:
                    raise
                await self.send_error(exc)
        return self._ready.popleft()

    def _native(self, message: dict[str, Any]) -> None:
        self._ready.append(Frame(text=json.dumps(message)))

    async def _translate(self, text: str) -> None:
        self._client_event = None
        try:
            event_id, event = rt.parse_client_event(text)
        except rt.RealtimeError as exc:
            self._client_event = exc.event_id
            raise
        self._client_event = event_id
        match event:
            case rt.SessionUpdate():
                self._native({"type": "session.update", "session": rt.native_patch(event.session)})
            case rt.Append():
                self._append(event.audio)
            case rt.Commit():
                if self._open_item is None:
                    raise rt.RealtimeError(
                        "no speech heard since the last commit: nothing to commit",
                        "input_audio_buffer_commit_empty",
                    )
                self._native({"type": "input_audio.commit"})
                self._answering_commit = True
            case rt.Clear():
                self._open_item = None
                self._native({"type": "input_audio.clear"})
                await self._emit({"type": "input_audio_buffer.cleared"})
            case rt.ItemCreate():
                await self._create_item(event.item, event.previous_item_id)
            case rt.ResponseCreate():
                if self._texts:
                    text, self._texts = " ".join(self._texts), []
                    self._native({"type": "conversation.text", "text": text})
                elif self._answering_commit:
                    pass  # the committed turn is answered once transcribed: this is that answer
                else:
                    self._native({"type": "response.create"})
            case rt.ResponseCancel():
                if self._reply is None:
                    raise rt.RealtimeError(
                        "Cancellation failed: no active response found",
                        "response_cancel_not_active",
                    )
                self._reply.client_cancelled = True
                self._native({"type": "response.cancel"})

    def _append(self, audio: str) -> None:
        try:
            pcm = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidAudio("input_audio_buffer.append: audio is not valid base64") from exc
        if not pcm or len(pcm) % 2:
            raise InvalidAudio("input_audio_buffer.append: audio must be whole PCM16 samples")
        rate = self.config.input_sample_rate if self.config else 24000
        step = 2 * rate  # the Session takes frames of at most one second
        for start in range(0, len(pcm), step):
            self._ready.append(Frame(data=pcm[start : start + step]))

    async def _create_item(self, item: rt.Item, previous: str | None) -> None:
        texts = [c.text for c in item.content if c.type in ("input_text", "text") and c.text]
        if item.type != "message" or item.role != "user" or not texts:
            raise rt.RealtimeError(
                "only user message items with input_text content are supported",
                "unsupported_item",
                "item",
            )
        item_id = item.id or f"item_{uuid.uuid4().hex[:16]}"
        self._texts.append(" ".join(texts))
        content = [{"type": "input_text", "text": t} for t in texts]
        await self._item_created(item_id, "user", content, previous or self._last_item)

    # ------------------------------------------------------------ Session → client

    async def send(self, event: Event) -> None:
        match event:
            case SessionCreated() | SessionUpdated():
                self.config = event.session
                kind = "session.created" if isinstance(event, SessionCreated) else "session.updated"
                session = shapes.session_object(event.session, self.vad, self.beta)
                await self._emit({"type": kind, "session": session})
            case SpeechStarted():
                self._open_item = event.utterance_id
                await self._emit(
                    {
                        "type": "input_audio_buffer.speech_started",
                        "audio_start_ms": event.audio_start_ms,
                        "item_id": event.utterance_id,
                    }
                )
            case SpeechStopped():
                await self._speech_stopped(event)
            case TranscriptPartial():
                await self._partial(event)
            case TranscriptFinal():
                self._partials.pop(event.utterance_id, None)
                if not event.text.strip():
                    self._answering_commit = False  # no words: the Session will not answer
                await self._emit(
                    {
                        "type": "conversation.item.input_audio_transcription.completed",
                        "item_id": event.utterance_id,
                        "content_index": 0,
                        "transcript": event.text,
                    }
                )
            case ResponseCreated():
                await self._response_created(event)
            case ResponseTextDelta():
                await self._text_delta(event)
            case ResponseAudioDone():
                await self._audio_done(event)
            case OutputAudioClear():
                await self._emit(
                    {"type": "output_audio_buffer.cleared", "response_id": event.response_id}
                )
            case ResponseDone():
                await self._response_done(event)
            case ErrorEvent():
                await self._error(event.code, event.message, None)

    async def send_audio(self, data: bytes) -> None:
        reply = self._reply
        if reply is None:
            return
        await self._emit(
            {
                "type": "response.output_audio.delta",
                **self._part(reply),
                "delta": base64.b64encode(data).decode("ascii"),
            }
        )

    async def send_error(
        self, exc: VoiceAgentError, request_id: str | None = None, fatal: bool | None = None
    ) -> None:
        metrics.ERRORS.labels(self.service, exc.code).inc()
        await self._error(exc.code, exc.message, getattr(exc, "param", None))

    async def _error(self, code: str, message: str, param: str | None) -> None:
        await self._emit(shapes.error_event(code, message, param, self._client_event))

    async def _emit(self, event: dict[str, Any]) -> None:
        await self._send_text(json.dumps(shapes.framed(event, self.beta)))

    async def _item_created(
        self, item_id: str, role: str, content: list[dict[str, Any]], previous: str | None
    ) -> None:
        item = shapes.message_item(item_id, role, "completed", content)
        await self._emit(
            {"type": "conversation.item.created", "previous_item_id": previous, "item": item}
        )
        self._last_item = item_id

    async def _speech_stopped(self, event: SpeechStopped) -> None:
        item_id = event.utterance_id
        self._open_item = None
        previous = self._last_item
        await self._emit(
            {
                "type": "input_audio_buffer.speech_stopped",
                "audio_end_ms": event.audio_end_ms,
                "item_id": item_id,
            }
        )
        await self._emit(
            {
                "type": "input_audio_buffer.committed",
                "previous_item_id": previous,
                "item_id": item_id,
            }
        )
        content = [{"type": "input_audio", "transcript": None}]
        await self._item_created(item_id, "user", content, previous)

    async def _partial(self, event: TranscriptPartial) -> None:
        """Our partials are whole interim texts; OpenAI's deltas are increments: send what a
        partial adds to the previous one (a revision that changes earlier words sends none)."""
        before = self._partials.get(event.utterance_id, "")
        if not event.text.startswith(before) or len(event.text) == len(before):
            return
        self._partials[event.utterance_id] = event.text
        await self._emit(
            {
                "type": "conversation.item.input_audio_transcription.delta",
                "item_id": event.utterance_id,
                "content_index": 0,
                "delta": event.text[len(before) :],
            }
        )

    def _part(self, reply: _Reply) -> dict[str, Any]:
        return shapes.content_ref(reply.id, reply.item_id)

    def _response(self, reply: _Reply, status: str, output: list[Any]) -> dict[str, Any]:
        details = shapes.status_details(status, reply.client_cancelled)
        conversation = self.config.id if self.config else None
        return shapes.response_object(reply.id, status, output, details, conversation)

    async def _response_created(self, event: ResponseCreated) -> None:
        reply = _Reply(event.response_id, f"item_{event.response_id.removeprefix('resp_')}")
        self._reply = reply
        self._answering_commit = False
        response = self._response(reply, "in_progress", [])
        await self._emit({"type": "response.created", "response": response})
        item = shapes.assistant_item(reply.item_id, "in_progress", None, self.beta)
        await self._emit(
            {
                "type": "response.output_item.added",
                "response_id": reply.id,
                "output_index": 0,
                "item": item,
            }
        )
        await self._emit(
            {"type": "conversation.item.created", "previous_item_id": self._last_item, "item": item}
        )
        self._last_item = reply.item_id
        part = {"type": "audio", "transcript": ""}
        await self._emit({"type": "response.content_part.added", **self._part(reply), "part": part})

    async def _text_delta(self, event: ResponseTextDelta) -> None:
        reply = self._reply
        if reply is None or reply.id != event.response_id:
            return
        reply.transcript.append(event.delta)
        await self._emit(
            {
                "type": "response.output_audio_transcript.delta",
                **self._part(reply),
                "delta": event.delta,
            }
        )

    async def _audio_done(self, event: ResponseAudioDone) -> None:
        reply = self._reply
        if reply is None or reply.id != event.response_id:
            return
        await self._emit({"type": "response.output_audio.done", **self._part(reply)})
        transcript = "".join(reply.transcript)
        await self._emit(
            {
                "type": "response.output_audio_transcript.done",
                **self._part(reply),
                "transcript": transcript,
            }
        )

    async def _response_done(self, event: ResponseDone) -> None:
        reply = self._reply
        if reply is None or reply.id != event.response_id:
            return
        self._reply = None
        item_status = "completed" if event.status == "completed" else "incomplete"
        item = shapes.assistant_item(reply.item_id, item_status, event.text, self.beta)
        part = {"type": "audio", "transcript": event.text}
        await self._emit({"type": "response.content_part.done", **self._part(reply), "part": part})
        await self._emit(
            {
                "type": "response.output_item.done",
                "response_id": reply.id,
                "output_index": 0,
                "item": item,
            }
        )
        response = self._response(reply, event.status, [item])
        await self._emit({"type": "response.done", "response": response})
