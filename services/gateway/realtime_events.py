"""OpenAI Realtime API client events (GA shapes, beta's flat session too), parsed once.

Only what `/v1/realtime` acts on is modelled; unknown fields are ignored, as OpenAI does.
See docs/realtime.md for the mapping onto `/v1/stream`'s session.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from services.common.audio.pcm import ALLOWED_SAMPLE_RATES
from services.common.errors import InvalidMessage, UnsupportedSampleRate
from services.common.protocol.events import BOUNDED_JSON, G711_RATE, AudioEncoding, TurnDetection

RATES = ALLOWED_SAMPLE_RATES


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore")


class AudioFormat(_Loose):
    """GA: `{"type": "audio/pcm", "rate": 24000}`, `{"type": "audio/pcmu"}` (G.711 mu-law,
    8 kHz) or `{"type": "audio/pcma"}` (A-law)."""

    type: str = "audio/pcm"
    rate: int | None = None


class RtTurnDetection(_Loose):
    type: str = "server_vad"
    threshold: float | None = Field(default=None, gt=0.0, lt=1.0)
    prefix_padding_ms: int | None = Field(default=None, ge=0, le=2_000)
    silence_duration_ms: int | None = Field(default=None, ge=32, le=10_000)
    create_response: bool | None = None
    interrupt_response: bool | None = None


class Transcription(_Loose):
    model: str | None = None
    language: str | None = Field(default=None, max_length=16)
    prompt: str | None = None


class AudioInput(_Loose):
    format: AudioFormat | None = None
    transcription: Transcription | None = None
    turn_detection: RtTurnDetection | None = None


class AudioOutput(_Loose):
    format: AudioFormat | None = None
    voice: str | None = Field(default=None, min_length=1, max_length=128)


class AudioConfig(_Loose):
    input: AudioInput | None = None
    output: AudioOutput | None = None


class RtTool(_Loose):
    """A function the client runs: `{"type":"function","name","description","parameters"}`."""

    type: str = "function"
    name: str = Field(default="", max_length=64)
    description: str = Field(default="", max_length=4096)
    parameters: Annotated[dict[str, Any], BOUNDED_JSON] | None = None


class RtFunctionChoice(_Loose):
    type: Literal["function"]
    name: str = Field(max_length=64)


class RtSession(_Loose):
    """`session.update`'s session: GA's nested `audio`, or beta's flat fields."""

    model: str | None = Field(default=None, max_length=128)
    instructions: str | None = Field(default=None, max_length=16_384)
    tools: list[RtTool] | None = Field(default=None, max_length=128)
    tool_choice: Literal["auto", "none", "required"] | RtFunctionChoice | None = None
    audio: AudioConfig | None = None
    # beta (flat) shape
    voice: str | None = Field(default=None, min_length=1, max_length=128)
    input_audio_format: str | None = None
    output_audio_format: str | None = None
    turn_detection: RtTurnDetection | None = None
    input_audio_transcription: Transcription | None = None


class Content(_Loose):
    type: str
    text: str | None = Field(default=None, max_length=8192)


class Item(_Loose):
    id: str | None = Field(default=None, max_length=64)
    type: str = "message"
    role: str | None = None
    content: list[Content] = []
    call_id: str | None = Field(default=None, max_length=128)
    """`function_call_output`: the call it answers."""
    output: str | None = Field(default=None, max_length=100_000)
    """`function_call_output`: the result, as text (JSON, usually)."""


class _Event(_Loose):
    event_id: str | None = Field(default=None, max_length=128)


class SessionUpdate(_Event):
    type: Literal["session.update"]
    session: RtSession


class Append(_Event):
    type: Literal["input_audio_buffer.append"]
    audio: str


class Commit(_Event):
    type: Literal["input_audio_buffer.commit"]


class Clear(_Event):
    type: Literal["input_audio_buffer.clear"]


class ItemCreate(_Event):
    type: Literal["conversation.item.create"]
    item: Item
    previous_item_id: str | None = None


class ResponseCreate(_Event):
    type: Literal["response.create"]
    response: dict[str, Any] | None = None


class ResponseCancel(_Event):
    type: Literal["response.cancel"]
    response_id: str | None = None


class Truncate(_Event):
    """What the client played of an assistant item (the server keeps what was heard
    already: acknowledged, nothing more)."""

    type: Literal["conversation.item.truncate"]
    item_id: str = Field(max_length=64)
    content_index: int = Field(ge=0)
    audio_end_ms: int = Field(ge=0)


class Retrieve(_Event):
    type: Literal["conversation.item.retrieve"]
    item_id: str = Field(max_length=64)


UNSUPPORTED = frozenset(
    {
        "conversation.item.delete",
        "output_audio_buffer.clear",
        "transcription_session.update",
    }
)

ClientEvent = Annotated[
    SessionUpdate
    | Append
    | Commit
    | Clear
    | ItemCreate
    | Truncate
    | Retrieve
    | ResponseCreate
    | ResponseCancel,
    Field(discriminator="type"),
]
CLIENT_EVENTS: TypeAdapter[ClientEvent] = TypeAdapter(ClientEvent)


class RealtimeError(InvalidMessage):
    """A client event OpenAI would refuse, with OpenAI's `code` and `param`."""

    def __init__(self, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.param = param
        self.event_id: str | None = None
        """The `event_id` of the client event refused, when it had one."""


def parse_client_event(text: str) -> tuple[str | None, ClientEvent]:
    """(event_id, event) of one client frame; RealtimeError for anything we do not take."""
    try:
        raw: Any = json.loads(text)
    except (ValueError, RecursionError) as exc:  # ValueError: JSONDecodeError, or a huge int
        raise RealtimeError("the event is not valid JSON", "invalid_json") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
        raise RealtimeError("an event must be an object with a string `type`", "invalid_value")
    event_id = raw.get("event_id") if isinstance(raw.get("event_id"), str) else None
    try:
        return event_id, _validate(raw)
    except RealtimeError as exc:
        exc.event_id = event_id
        raise


def _validate(raw: dict[str, Any]) -> ClientEvent:
    kind = raw["type"]
    if kind in UNSUPPORTED:
        raise RealtimeError(f"{kind!r} is not supported by this server", "unsupported_event")
    try:
        return CLIENT_EVENTS.validate_python(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        if first["type"] == "union_tag_invalid":
            raise RealtimeError(
                f"Invalid value: {kind!r}. Supported values are: session.update, "
                "input_audio_buffer.append, input_audio_buffer.commit, "
                "input_audio_buffer.clear, conversation.item.create, "
                "conversation.item.truncate, conversation.item.retrieve, response.create, "
                "response.cancel.",
                "invalid_value",
                "type",
            ) from exc
        where = ".".join(str(p) for p in first["loc"][1:])
        raise RealtimeError(f"{where}: {first['msg']}", "invalid_value", where) from exc


FORMATS: dict[str, AudioEncoding] = {
    "audio/pcm": "pcm16",
    "audio/pcmu": "pcmu",
    "audio/pcma": "pcma",
    "pcm16": "pcm16",
    "g711_ulaw": "pcmu",
    "g711_alaw": "pcma",
}
"""OpenAI's format names (GA's `type`s, beta's strings) → the native session's codings."""


def _format(fmt: AudioFormat | str | None, where: str) -> tuple[AudioEncoding, int] | None:
    """The coding and rate of a format (None: unchanged). PCM16 at the wire's rates (24 kHz
    unless given), G.711 mu-law / A-law at 8 kHz; anything else is refused."""
    if fmt is None:
        return None
    name, rate = (fmt, None) if isinstance(fmt, str) else (fmt.type, fmt.rate)
    coding = FORMATS.get(name)
    if coding is None or (isinstance(fmt, str) != (name in BETA_FORMATS)):
        allowed = BETA_FORMATS if isinstance(fmt, str) else GA_FORMATS
        raise RealtimeError(
            f"{where} {name!r}: use one of {', '.join(repr(a) for a in allowed)}",
            "invalid_value",
        )
    if coding != "pcm16":
        if rate not in (None, G711_RATE):
            raise UnsupportedSampleRate(f"{where}.rate {rate}: {name} is {G711_RATE} Hz only")
        return coding, G711_RATE
    if rate is not None and rate not in RATES:
        raise UnsupportedSampleRate(f"{where}.rate {rate}: use one of {RATES}")
    return coding, rate or 24000


BETA_FORMATS = ("pcm16", "g711_ulaw", "g711_alaw")
GA_FORMATS = ("audio/pcm", "audio/pcmu", "audio/pcma")


def _turns(detection: RtTurnDetection | None) -> TurnDetection:
    if detection is None:
        return TurnDetection(type="manual")
    if detection.type not in ("server_vad", "semantic_vad"):
        raise RealtimeError(f"turn_detection.type {detection.type!r}", "invalid_value")
    return TurnDetection(
        type="server_vad",
        threshold=detection.threshold,
        silence_ms=detection.silence_duration_ms,
        prefix_padding_ms=detection.prefix_padding_ms,
    )


def _tools(tools: list[RtTool]) -> list[dict[str, Any]]:
    """OpenAI's (flat) function tools as the native session's; other kinds are refused."""
    native = []
    for tool in tools:
        if tool.type != "function":
            raise RealtimeError(
                f"tools: {tool.type!r} tools are not supported (only 'function')",
                "invalid_value",
                "session.tools",
            )
        spec = {"name": tool.name, "description": tool.description}
        native.append({**spec, **({"parameters": tool.parameters} if tool.parameters else {})})
    return native


def native_patch(session: RtSession, agents: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The `/v1/stream` `session.update` patch that an OpenAI `session.update` means; a
    `model` that names one of `agents` picks that agent (any other is ignored)."""
    audio = session.audio or AudioConfig()
    given_in = audio.input.model_fields_set if audio.input else set()
    source = audio.input or AudioInput()
    patch: dict[str, Any] = {}
    if session.model in agents:
        patch["agent"] = session.model
    if session.instructions is not None:
        patch["instructions"] = session.instructions
    if session.tools is not None:
        patch["tools"] = _tools(session.tools)
    if session.tool_choice is not None:
        choice = session.tool_choice
        patch["tool_choice"] = choice if isinstance(choice, str) else choice.model_dump()
    voice = (audio.output.voice if audio.output else None) or session.voice
    if voice is not None:
        patch["voice"] = voice
    given = _format(source.format or session.input_audio_format, "input format")
    sent = _format(
        (audio.output.format if audio.output else None) or session.output_audio_format,
        "output format",
    )
    if given is not None:
        patch["input_format"], patch["input_sample_rate"] = given
    if sent is not None:
        patch["output_format"], patch["output_sample_rate"] = sent
    if "turn_detection" in given_in:
        patch["turn_detection"] = _turns(source.turn_detection).model_dump(exclude_none=True)
    elif "turn_detection" in session.model_fields_set:
        patch["turn_detection"] = _turns(session.turn_detection).model_dump(exclude_none=True)
    transcription = source.transcription or session.input_audio_transcription
    if transcription is not None:  # OpenAI streams transcription deltas only when asked to
        patch["partials"] = True
        if transcription.language:
            patch["language"] = transcription.language
    return patch
