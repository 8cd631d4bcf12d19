"""`/v1/realtime`: the OpenAI Realtime API as a codec over `/v1/stream`'s Session.

`RealtimeCodec` is a `Codec` (services/gateway/codec.py): inbound, each OpenAI client
event becomes typed native inputs (base64 audio → PCM16 frames of at most 1 s; text items
→ `conversation.text`), parsed once; outbound, each native event becomes the OpenAI
events a client expects (GA names; beta names when the client sends
`OpenAI-Beta: realtime=v1`). No second pipeline: turns, barge-in, ASR/TTS jobs and pacing
are the Session's own.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from services.common.audio.vad import VadSettings
from services.common.errors import InvalidAudio, VoiceAgentError
from services.common.protocol.events import (
    MAX_TEXT_CHARS,
    AudioEncoding,
    ConversationToolResult,
    ErrorEvent,
    Event,
    InputAudioClear,
    InputAudioCommit,
    OutputAudioClear,
    ResponseAudioDone,
    ResponseCancel,
    ResponseCreate,
    ResponseCreated,
    ResponseDone,
    ResponseFunctionCall,
    ResponseTextDelta,
    SessionConfig,
    SessionCreated,
    SessionPatch,
    SessionUpdate,
    SessionUpdated,
    SpeechStarted,
    SpeechStopped,
    TranscriptFinal,
    TranscriptPartial,
    not_blank,
)
from services.common.service.ws import Frame
from services.gateway import realtime_events as rt
from services.gateway import realtime_shapes as shapes
from services.gateway.codec import AudioIn, ClientInput, Decoded, Outgoing, UserItem, WireAudio

REALTIME_SESSION: dict[str, object] = {"input_sample_rate": 24000, "output_sample_rate": 24000}
"""A `/v1/realtime` session starts with OpenAI's formats: PCM16 at 24 kHz both ways."""

TRANSCRIPTION_FAILED = frozenset(
    {"asr_unavailable", "invalid_audio", "invalid_message", "unsupported_sample_rate"}
)
"""The codes of a turn's failed transcription (`hearing.job_error`: the ASR's own when it
names the audio, else `asr_unavailable`), as an error of no client event: the committed
turn will not be answered."""

ITEMS_KEPT = 256
"""The items `conversation.item.retrieve` can find: the conversation's most recent."""


@dataclass
class _Reply:
    """The assistant item of the response under way."""

    id: str
    item_id: str
    transcript: list[str] = field(default_factory=list)
    client_cancelled: bool = False
    audio_done: bool = False
    """Its audio part was closed (`response.output_audio.done` sent)."""
    calls: list[dict[str, Any]] = field(default_factory=list)
    """Its function_call items (output 1, 2, ...), sent as they came."""


class RealtimeCodec:
    """OpenAI Realtime events to the client, typed native inputs to the Session."""

    confirms_playout = False

    def __init__(
        self,
        beta: bool = False,
        vad: VadSettings | None = None,
        agents: frozenset[str] = frozenset(),
        duplex: bool = False,
    ) -> None:
        self.beta = beta
        self.duplex = duplex
        """The duplex backend: its model answers by itself, in one response that never
        ends (its session refuses response.create as not supported)."""
        self.vad = vad or VadSettings()
        self.agents = agents
        """The gateway's agents: a `session.update` `model` naming one picks it."""
        self.config: SessionConfig | None = None
        self.audio = WireAudio()
        """The session's audio codings (PCM16, or G.711 for `audio/pcmu` / `audio/pcma`)."""
        self._client_event: str | None = None  # event_id of the client event being handled
        self._open_item: str | None = None  # the user's utterance the VAD has open
        self._last_item: str | None = None
        self._items: dict[str, dict[str, Any]] = {}
        """The last ITEMS_KEPT items by id, each as the client was last told of it."""
        self._partials: dict[str, str] = {}
        """Per utterance, the interim transcript sent as deltas (or held: no item yet)."""
        self._reply: _Reply | None = None
        self._answering_commit = False
        """A committed turn (a manual commit, or the VAD's end of turn) is answered by the
        Session once transcribed: a response.create meanwhile is that answer."""
        self._words_owed = False
        """A transcript with words came since the last response.created: the Session will
        answer it (a held turn), whatever a later utterance holds."""
        self._create_waiting: str | None = None
        """The event_id ("" without one) of a response.create left to a committed turn's
        transcript: an empty transcript answers it with an error, never with silence."""
        self._calls: set[str] = set()  # call_ids of the function calls sent to the client
        self._out: list[Outgoing] = []

    # ------------------------------------------------------------ client → Session

    def decode(self, frame: Frame) -> Decoded:
        if frame.data is not None:  # raw audio at the input rate and coding, as on /v1/stream
            return Decoded([AudioIn(self.audio.to_pcm(frame.data))])
        inputs = self._translate(frame.text or "")
        return Decoded(inputs, self._flush())

    def _translate(self, text: str) -> list[ClientInput]:
        self._client_event = None
        try:
            event_id, event = rt.parse_client_event(text)
        except rt.RealtimeError as exc:
            self._client_event = exc.event_id
            raise
        self._client_event = event_id
        match event:
            case rt.SessionUpdate():
                return [SessionUpdate(type="session.update", session=self._patch(event.session))]
            case rt.Append():
                return self._append(event.audio)
            case rt.Commit():
                if self._open_item is None:
                    raise rt.RealtimeError(
                        "no speech heard since the last commit: nothing to commit",
                        "input_audio_buffer_commit_empty",
                    )
                self._answering_commit = not self.duplex
                return [InputAudioCommit(type="input_audio.commit")]
            case rt.Clear():
                self._partials.pop(self._open_item or "", None)
                self._open_item = None
                self._emit({"type": "input_audio_buffer.cleared"})
                return [InputAudioClear(type="input_audio.clear")]
            case rt.ItemCreate() if event.item.type == "function_call_output":
                return [self._tool_output(event.item)]
            case rt.ItemCreate():
                return [self._create_item(event.item)]
            case rt.Truncate():
                self._truncate(event)
                return []
            case rt.Retrieve():
                self._emit({"type": "conversation.item.retrieved", "item": self._known(event)})
                return []
            case rt.ResponseCreate():
                if self._reply is not None and not self.duplex:
                    raise rt.RealtimeError(
                        f"Conversation already has an active response in progress: "
                        f"{self._reply.id}. Wait until the response is finished before "
                        "creating a new one.",
                        "conversation_already_has_active_response",
                    )
                if self._answering_commit:
                    # the committed turn is answered once transcribed: this is that answer
                    self._create_waiting = event_id or ""
                    return []
                return [ResponseCreate(type="response.create")]
            case rt.ResponseCancel():
                if self._reply is None or event.response_id not in (None, self._reply.id):
                    raise rt.RealtimeError(
                        "Cancellation failed: no active response found",
                        "response_cancel_not_active",
                    )
                self._reply.client_cancelled = True
                return [ResponseCancel(type="response.cancel")]

    def _patch(self, session: rt.RtSession) -> SessionPatch:
        try:
            return SessionPatch.model_validate(rt.native_patch(session, self.agents))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = "session." + ".".join(str(p) for p in first["loc"])
            raise rt.RealtimeError(f"{where}: {first['msg']}", "invalid_value", where) from exc

    def _tool_output(self, item: rt.Item) -> ConversationToolResult:
        """A `function_call_output` item: the result of a call, for the agent's next answer."""
        if not item.call_id or item.output is None:
            raise rt.RealtimeError(
                "a function_call_output item needs `call_id` and `output`",
                "invalid_value",
                "item.call_id" if not item.call_id else "item.output",
            )
        if item.call_id not in self._calls:  # refused before any item.created says otherwise
            raise rt.RealtimeError(
                f"no function call {item.call_id!r} in this conversation",
                "invalid_value",
                "item.call_id",
            )
        item_id = item.id or f"item_{uuid.uuid4().hex[:16]}"
        self._added(shapes.function_output_item(item_id, item.call_id, item.output))
        return ConversationToolResult(
            type="conversation.tool_result", call_id=item.call_id, output=item.output
        )

    def _append(self, audio: str) -> list[ClientInput]:
        try:
            data = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidAudio("input_audio_buffer.append: audio is not valid base64") from exc
        if not data or (self.audio.given == "pcm16" and len(data) % 2):
            raise InvalidAudio("input_audio_buffer.append: audio must be whole PCM16 samples")
        pcm = self.audio.to_pcm(data)
        rate = self.config.input_sample_rate if self.config else 24000
        step = 2 * rate  # the Session takes frames of at most one second
        return [AudioIn(pcm[start : start + step]) for start in range(0, len(pcm), step)]

    def _create_item(self, item: rt.Item) -> UserItem:
        """A user text item joins the conversation now (a voice turn before the next
        response.create hears it too); it is answered by a response.create."""
        texts = [c.text for c in item.content if c.type in ("input_text", "text") and c.text]
        if item.type != "message" or item.role != "user" or not texts:
            raise rt.RealtimeError(
                "only user message items with input_text content are supported",
                "unsupported_item",
                "item",
            )
        text = " ".join(texts)
        try:
            not_blank(text)
        except ValueError as exc:
            raise rt.RealtimeError(f"item.content: {exc}", "invalid_value", "item.content") from exc
        if len(text) > MAX_TEXT_CHARS:
            raise rt.RealtimeError(
                f"item.content: a user text item holds at most {MAX_TEXT_CHARS} characters",
                "invalid_value",
                "item.content",
            )
        item_id = item.id or f"item_{uuid.uuid4().hex[:16]}"
        content = [{"type": "input_text", "text": t} for t in texts]
        self._added(shapes.message_item(item_id, "user", "completed", content))
        return UserItem(text)

    def _truncate(self, event: rt.Truncate) -> None:
        """The server cut the item to what was heard already (the gateway paces its audio):
        a truncate is acknowledged, and changes nothing."""
        item = self._known(event)
        if item["type"] != "message" or item["role"] != "assistant":
            raise rt.RealtimeError(
                "Only assistant messages with audio can be truncated.", "invalid_value", "item_id"
            )
        self._emit(
            {
                "type": "conversation.item.truncated",
                "item_id": event.item_id,
                "content_index": event.content_index,
                "audio_end_ms": event.audio_end_ms,
            }
        )

    def _known(self, event: rt.Truncate | rt.Retrieve) -> dict[str, Any]:
        """The item a truncate or retrieve names, or OpenAI's error for one not found."""
        item = self._items.get(event.item_id)
        if item is None:
            doing, verb = (
                ("truncating", "truncate")
                if isinstance(event, rt.Truncate)
                else ("retrieving", "retrieve")
            )
            raise rt.RealtimeError(
                f"Error {doing} item: the item with id {event.item_id!r} does not exist.",
                f"item_{verb}_invalid_item_id",
            )
        return item

    # ------------------------------------------------------------ Session → client

    def encode(self, event: Event) -> list[Outgoing]:
        match event:
            case SessionCreated() | SessionUpdated():
                self.config = event.session
                self.audio.follow(event)
                kind = "session.created" if isinstance(event, SessionCreated) else "session.updated"
                session = shapes.session_object(event.session, self.vad, self.beta)
                self._emit({"type": kind, "session": session})
            case SpeechStarted():
                self._open_item = event.utterance_id
                self._emit(
                    {
                        "type": "input_audio_buffer.speech_started",
                        "audio_start_ms": event.audio_start_ms,
                        "item_id": event.utterance_id,
                    }
                )
            case SpeechStopped():
                self._speech_stopped(event)
            case TranscriptPartial():
                self._partial(event)
            case TranscriptFinal():
                self._partials.pop(event.utterance_id, None)
                self._heard(event)
                self._emit(
                    {
                        "type": "conversation.item.input_audio_transcription.completed",
                        "item_id": event.utterance_id,
                        "content_index": 0,
                        "transcript": event.text,
                        "usage": {"type": "duration", "seconds": _seconds(event)},
                    }
                )
                if event.text.strip():
                    self._words_owed = True
                elif not self._words_owed:
                    self._answering_commit = False  # no words: the Session will not answer
                    self._answer_waiting_create(
                        "the committed audio held no words: there is nothing to respond to"
                    )
            case ResponseCreated():
                self._response_created(event)
            case ResponseTextDelta():
                self._text_delta(event)
            case ResponseFunctionCall():
                self._function_call(event)
            case ResponseAudioDone():
                self._audio_done(event)
            case OutputAudioClear():
                self._emit(
                    {"type": "output_audio_buffer.cleared", "response_id": event.response_id}
                )
            case ResponseDone():
                self._response_done(event)
            case ErrorEvent():
                self._error(event.code, event.message, None, event.fatal, None)
        return self._flush()

    def encode_audio(self, pcm: bytes, coding: AudioEncoding | None = None) -> list[Outgoing]:
        reply = self._reply
        if reply is not None:
            delta = base64.b64encode(self.audio.from_pcm(pcm, coding)).decode("ascii")
            self._emit({"type": "response.output_audio.delta", **self._part(reply), "delta": delta})
        return self._flush()

    def encode_error(
        self, exc: VoiceAgentError, fatal: bool, answering: bool = False
    ) -> list[Outgoing]:
        """An error in answer to the client event just decoded carries its event_id; one
        that happened meanwhile (a reply's agent failing, the ASR out of reach) none."""
        cause = self._client_event if answering else None
        if not answering and exc.code in TRANSCRIPTION_FAILED and not self._words_owed:
            self._answering_commit = False  # the committed turn will not be answered
            self._create_waiting = None  # this error answers its response.create
        self._error(exc.code, exc.message, getattr(exc, "param", None), fatal, cause)
        return self._flush()

    def _error(
        self, code: str, message: str, param: str | None, fatal: bool, cause: str | None
    ) -> None:
        self._emit(shapes.error_event(code, message, param, cause, fatal))

    def _answer_waiting_create(self, why: str) -> None:
        waiting, self._create_waiting = self._create_waiting, None
        if waiting is not None:
            self._emit(
                shapes.error_event(
                    "input_audio_buffer_commit_empty", why, None, waiting or None, False
                )
            )

    def _emit(self, event: dict[str, Any]) -> None:
        self._out.append(json.dumps(shapes.framed(event, self.beta)))

    def _flush(self) -> list[Outgoing]:
        out, self._out = self._out, []
        return out

    def _added(self, item: dict[str, Any]) -> None:
        """An item joins the conversation, at its end (whatever `previous_item_id` a
        client asked for): `previous_item_id` says which item it follows."""
        self._emit(
            {"type": "conversation.item.created", "previous_item_id": self._last_item, "item": item}
        )
        self._last_item = item["id"]
        self._described(item)

    def _described(self, item: dict[str, Any]) -> None:
        """The item as the client was last told of it, for `conversation.item.retrieve`."""
        self._items.pop(item["id"], None)
        self._items[item["id"]] = item
        if len(self._items) > ITEMS_KEPT:
            del self._items[next(iter(self._items))]

    def _heard(self, event: TranscriptFinal) -> None:
        """A user audio item's transcript, once it came."""
        item = self._items.get(event.utterance_id)
        if item is not None:
            content = [{"type": "input_audio", "transcript": event.text}]
            self._items[event.utterance_id] = {**item, "content": content}

    def _speech_stopped(self, event: SpeechStopped) -> None:
        item_id = event.utterance_id
        self._open_item = None
        if not self.duplex:  # answered once transcribed (the duplex model answers by itself)
            self._answering_commit = True
        previous = self._last_item
        self._emit(
            {
                "type": "input_audio_buffer.speech_stopped",
                "audio_end_ms": event.audio_end_ms,
                "item_id": item_id,
            }
        )
        self._emit(
            {
                "type": "input_audio_buffer.committed",
                "previous_item_id": previous,
                "item_id": item_id,
            }
        )
        content = [{"type": "input_audio", "transcript": None}]
        self._added(shapes.message_item(item_id, "user", "completed", content))
        held = self._partials.get(item_id, "")
        if held:
            self._transcription_delta(item_id, held)

    def _partial(self, event: TranscriptPartial) -> None:
        """Our partials are whole interim texts; OpenAI's deltas are increments: send what a
        partial adds to the previous one (a revision that changes earlier words sends none).
        Before the utterance's item exists, the latest is held: sent once it does (one of
        an utterance cleared meanwhile, never)."""
        utterance = event.utterance_id
        if utterance not in self._items:
            if utterance == self._open_item:
                self._partials[utterance] = event.text
            return
        before = self._partials.get(utterance, "")
        if not event.text.startswith(before) or len(event.text) == len(before):
            return
        self._partials[utterance] = event.text
        self._transcription_delta(utterance, event.text[len(before) :])

    def _transcription_delta(self, item_id: str, delta: str) -> None:
        self._emit(
            {
                "type": "conversation.item.input_audio_transcription.delta",
                "item_id": item_id,
                "content_index": 0,
                "delta": delta,
            }
        )

    def _part(self, reply: _Reply) -> dict[str, Any]:
        return shapes.content_ref(reply.id, reply.item_id)

    def _response(self, reply: _Reply, status: str, output: list[Any]) -> dict[str, Any]:
        details = shapes.status_details(status, reply.client_cancelled)
        conversation = self.config.id if self.config else None
        return shapes.response_object(reply.id, status, output, details, conversation)

    def _response_created(self, event: ResponseCreated) -> None:
        reply = _Reply(event.response_id, f"item_{event.response_id.removeprefix('resp_')}")
        self._reply = reply
        self._answering_commit = self._words_owed = False
        self._create_waiting = None
        response = self._response(reply, "in_progress", [])
        self._emit({"type": "response.created", "response": response})
        item = shapes.assistant_item(reply.item_id, "in_progress", None, self.beta)
        self._emit(
            {
                "type": "response.output_item.added",
                "response_id": reply.id,
                "output_index": 0,
                "item": item,
            }
        )
        self._added(item)
        part = {"type": "audio", "transcript": ""}
        self._emit({"type": "response.content_part.added", **self._part(reply), "part": part})

    def _text_delta(self, event: ResponseTextDelta) -> None:
        reply = self._reply
        if reply is None or reply.id != event.response_id:
            return
        reply.transcript.append(event.delta)
        self._emit(
            {
                "type": "response.output_audio_transcript.delta",
                **self._part(reply),
                "delta": event.delta,
            }
        )

    def _function_call(self, event: ResponseFunctionCall) -> None:
        """A call of the client's tool: its item, its arguments (whole: the gateway
        assembled them), then the item done."""
        reply = self._reply
        if reply is None or reply.id != event.response_id:
            return
        index = len(reply.calls) + 1
        item_id = f"item_{uuid.uuid4().hex[:16]}"
        self._calls.add(event.call_id)
        call = {"call_id": event.call_id, "name": event.name}
        started = shapes.function_call_item(item_id, "in_progress", call, "")
        ref = {"response_id": reply.id, "item_id": item_id, "output_index": index}
        self._emit(
            {"type": "response.output_item.added", **_minus(ref, "item_id"), "item": started}
        )
        self._added(started)
        args = event.arguments
        self._emit(
            {
                "type": "response.function_call_arguments.delta",
                **ref,
                **_only(call, "call_id"),
                "delta": args,
            }
        )
        self._emit(
            {"type": "response.function_call_arguments.done", **ref, **call, "arguments": args}
        )
        done = shapes.function_call_item(item_id, "completed", call, args)
        self._emit({"type": "response.output_item.done", **_minus(ref, "item_id"), "item": done})
        self._described(done)
        reply.calls.append(done)

    def _audio_done(self, event: ResponseAudioDone) -> None:
        reply = self._reply
        if reply is None or reply.id != event.response_id:
            return
        self._close_audio(reply, "".join(reply.transcript))

    def _close_audio(self, reply: _Reply, transcript: str) -> None:
        """The audio part's two `.done` events, once per response."""
        if reply.audio_done:
            return
        reply.audio_done = True
        self._emit({"type": "response.output_audio.done", **self._part(reply)})
        self._emit(
            {
                "type": "response.output_audio_transcript.done",
                **self._part(reply),
                "transcript": transcript,
            }
        )

    def _response_done(self, event: ResponseDone) -> None:
        reply = self._reply
        if reply is None or reply.id != event.response_id:
            return
        self._reply = None
        item_status = "completed" if event.status == "completed" else "incomplete"
        item = shapes.assistant_item(reply.item_id, item_status, event.text, self.beta)
        self._close_audio(reply, event.text)  # a cut one's too (what was heard), as OpenAI
        part = {"type": "audio", "transcript": event.text}
        self._emit({"type": "response.content_part.done", **self._part(reply), "part": part})
        self._emit(
            {
                "type": "response.output_item.done",
                "response_id": reply.id,
                "output_index": 0,
                "item": item,
            }
        )
        self._described(item)
        response = self._response(reply, event.status, [item, *reply.calls])
        self._emit({"type": "response.done", "response": response})


def _seconds(event: TranscriptFinal) -> float:
    """The length of the utterance a transcript is of (its usage, billed by duration)."""
    return round(max(0, event.audio_end_ms - event.audio_start_ms) / 1000, 3)


def _only(values: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: values[k] for k in keys}


def _minus(values: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in values.items() if k not in keys}
