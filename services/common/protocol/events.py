"""The wire protocol (docs/protocol.md) as typed models, parsed once at the edge.

Client messages are parsed with one discriminated-union adapter per endpoint;
unknown fields are ignored, an unknown `type` or bad field is InvalidMessage.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from services.common.audio.pcm import SampleRate
from services.common.errors import InvalidMessage, UnsupportedSampleRate, VoiceAgentError
from services.common.text import CONTROL_CHARACTERS


def not_blank(value: str) -> str:
    """`value` when it says something in characters that are text; else ValueError (the
    rule of NOT_BLANK, for text checked outside a model)."""
    if not value.strip():
        raise ValueError("must not be empty or only whitespace")
    if CONTROL_CHARACTERS.search(value):
        raise ValueError("must not hold control characters (NUL, ESC...)")
    return value


MAX_SCHEMA_DEPTH = 32
MAX_SCHEMA_CHARS = 32_768


def _bounded_json(value: Any) -> Any:
    """A JSON value a session can keep and send back: nested at most MAX_SCHEMA_DEPTH deep
    (pydantic will not serialize past 256) and at most MAX_SCHEMA_CHARS long."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise ValueError(f"nests deeper than {MAX_SCHEMA_DEPTH} levels")
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    if len(json.dumps(value)) > MAX_SCHEMA_CHARS:
        raise ValueError(f"is longer than {MAX_SCHEMA_CHARS} characters as JSON")
    return value


BOUNDED_JSON = AfterValidator(_bounded_json)
"""A client's JSON document kept in the session (a tool's parameter schema): bounded."""

NOT_BLANK = AfterValidator(not_blank)
"""Text that must say something, in characters that are text: `Annotated[str,
Field(max_length=N), NOT_BLANK]`."""


class Event(BaseModel):
    """Base of every wire message: unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore")

    def dump(self) -> str:
        """JSON text for a WebSocket text frame."""
        return self.model_dump_json(exclude_none=True)


# ---------------------------------------------------------------- gateway session


class TtsStyle(BaseModel):
    """How the voice speaks, for engines that take it (chatterbox); None: the engine's default."""

    model_config = ConfigDict(extra="ignore")

    exaggeration: float | None = Field(default=None, ge=0.0, le=2.0)
    cfg_weight: float | None = Field(default=None, ge=0.0, le=2.0)
    temperature: float | None = Field(default=None, ge=0.05, le=2.0)


class TurnDetection(BaseModel):
    """How the session's turns end: `server_vad` (silence ends a turn; None fields keep the
    gateway's VAD settings) or `manual` (only `input_audio.commit` ends a turn)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["server_vad", "manual"] = "server_vad"
    threshold: float | None = Field(default=None, gt=0.0, lt=1.0)
    silence_ms: int | None = Field(default=None, ge=32, le=10_000)
    prefix_padding_ms: int | None = Field(default=None, ge=0, le=2_000)


ToolName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
"""A function's name, as OpenAI's APIs take it."""


class ToolSpec(BaseModel):
    """A function the client runs (OpenAI's function tool): the agent may ask for a call with
    `response.function_call`; the client answers with `conversation.tool_result`."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function"] = "function"
    name: ToolName
    description: str = Field(default="", max_length=4096)
    parameters: Annotated[dict[str, Any], BOUNDED_JSON] = Field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )
    """The arguments' JSON schema."""


class FunctionChoice(BaseModel):
    """`tool_choice` naming the one function the agent must call."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function"] = "function"
    name: ToolName


ToolChoice = Literal["auto", "none", "required"] | FunctionChoice
"""Whether the agent may (`auto`), may not (`none`) or must (`required`, or a named function)
call a tool."""
ClientTools = Annotated[list[ToolSpec], Field(max_length=128)]


AudioEncoding = Literal["pcm16", "pcmu", "pcma"]
"""How audio travels: PCM16 little-endian, or G.711 mu-law / A-law (8 kHz only, one byte a
sample: telephone audio)."""
G711_RATE = 8000


def _telephone_rates(model: Any, fill: bool) -> None:
    """G.711 is 8 kHz: a G.711 format with no rate gets 8000 (`fill`), with another is an error."""
    for side in ("input", "output"):
        if getattr(model, f"{side}_format") in ("pcmu", "pcma"):
            rate = getattr(model, f"{side}_sample_rate")
            if rate is None and fill:
                setattr(model, f"{side}_sample_rate", G711_RATE)
            elif rate not in (None, G711_RATE):
                raise ValueError(f"{side}_format G.711 is 8 kHz only, not {rate} Hz")


class SessionConfig(BaseModel):
    """The session as the client sees it."""

    id: str
    input_sample_rate: SampleRate = 16000
    output_sample_rate: SampleRate = 24000
    input_format: AudioEncoding = "pcm16"
    """How the client's audio frames are coded (G.711 at 8 kHz only)."""
    output_format: AudioEncoding = "pcm16"
    voice: str = "default"
    language: str | None = "en"
    agent: str = "echo"
    instructions: str | None = None
    tts: TtsStyle | None = None
    turn_detection: TurnDetection | None = None
    partials: bool = False
    """Send `transcript.partial` while the user speaks (each costs an ASR pass)."""
    tools: ClientTools | None = None
    """Functions the client runs (None: none)."""
    tool_choice: ToolChoice | None = None
    """None: `auto`."""
    resumed: bool | None = None

    @model_validator(mode="after")
    def _g711_is_8k(self) -> SessionConfig:
        _telephone_rates(self, fill=False)
        return self

    def patched(self, patch: dict[str, Any]) -> SessionConfig:
        """These settings with a `session.update` patch applied (InvalidMessage when the
        result is not a valid session: a G.711 session given a rate other than 8 kHz)."""
        try:
            return SessionConfig.model_validate({**self.model_dump(), **patch})
        except ValidationError as exc:
            first = exc.errors()[0]
            raise InvalidMessage(f"bad 'session.update' message: {first['msg']}") from exc


class SessionPatch(BaseModel):
    """A subset of the session's settings, sent with `session.update`."""

    model_config = ConfigDict(extra="ignore")

    input_sample_rate: SampleRate | None = None
    output_sample_rate: SampleRate | None = None
    input_format: AudioEncoding | None = None
    """`pcmu` or `pcma` set the rate to 8 kHz as well (another rate with them is an error)."""
    output_format: AudioEncoding | None = None
    voice: Annotated[str, Field(max_length=128), NOT_BLANK] | None = None
    language: Annotated[str, Field(max_length=16), NOT_BLANK] | None = None
    agent: Annotated[str, Field(max_length=64), NOT_BLANK] | None = None
    instructions: str | None = Field(default=None, max_length=16_384)
    tts: TtsStyle | None = None
    turn_detection: TurnDetection | None = None
    partials: bool | None = None
    tools: ClientTools | None = None
    tool_choice: ToolChoice | None = None

    @model_validator(mode="after")
    def _g711_is_8k(self) -> SessionPatch:
        _telephone_rates(self, fill=True)
        return self


# ---------------------------------------------------------------- client → gateway


class SessionUpdate(Event):
    type: Literal["session.update"]
    session: SessionPatch


class InputAudioCommit(Event):
    type: Literal["input_audio.commit"]


class InputAudioClear(Event):
    type: Literal["input_audio.clear"]


MAX_TEXT_CHARS = 8192
"""The longest user turn given as text (`conversation.text`, `response.create`'s `text`)."""


class ConversationText(Event):
    type: Literal["conversation.text"]
    text: Annotated[str, Field(max_length=MAX_TEXT_CHARS), NOT_BLANK]


class ResponseCreate(Event):
    type: Literal["response.create"]
    text: Annotated[str, Field(max_length=MAX_TEXT_CHARS), NOT_BLANK] | None = None


class ResponseCancel(Event):
    type: Literal["response.cancel"]


class SessionClose(Event):
    type: Literal["session.close"]


class ConversationToolResult(Event):
    """The output of a client tool call (`response.function_call`); the next
    `response.create` lets the agent answer with it."""

    type: Literal["conversation.tool_result"]
    call_id: Annotated[str, Field(min_length=1, max_length=128)]
    output: str = Field(max_length=100_000)


ClientEvent = Annotated[
    SessionUpdate
    | InputAudioCommit
    | InputAudioClear
    | ConversationText
    | ResponseCreate
    | ResponseCancel
    | SessionClose
    | ConversationToolResult,
    Field(discriminator="type"),
]

# ---------------------------------------------------------------- gateway → client


class SessionCreated(Event):
    type: Literal["session.created"] = "session.created"
    session: SessionConfig
    notice: str | None = None
    """Why the session is not what a client might expect (no LLM answered: `echo` answers)."""


class SessionUpdated(Event):
    type: Literal["session.updated"] = "session.updated"
    session: SessionConfig


class SpeechStarted(Event):
    type: Literal["speech.started"] = "speech.started"
    utterance_id: str
    audio_start_ms: int


class SpeechStopped(Event):
    type: Literal["speech.stopped"] = "speech.stopped"
    utterance_id: str
    audio_end_ms: int


class TranscriptPartial(Event):
    type: Literal["transcript.partial"] = "transcript.partial"
    utterance_id: str
    text: str


class TranscriptFinal(Event):
    type: Literal["transcript.final"] = "transcript.final"
    utterance_id: str
    text: str
    audio_start_ms: int
    audio_end_ms: int
    language: str | None = None
    """The language the ASR heard (its code: `en`, `de`), detected when the session names
    none; absent when the ASR does not say."""


class ResponseCreated(Event):
    type: Literal["response.created"] = "response.created"
    response_id: str
    utterance_id: str | None = None


class ResponseTextDelta(Event):
    type: Literal["response.text.delta"] = "response.text.delta"
    response_id: str
    delta: str


class ResponseFunctionCall(Event):
    """The agent calls a client tool: run it, answer with `conversation.tool_result`."""

    type: Literal["response.function_call"] = "response.function_call"
    response_id: str
    call_id: str
    name: str
    arguments: str
    """The arguments as JSON text (the model's own; parse and check them)."""


class ResponseAudioDone(Event):
    type: Literal["response.audio.done"] = "response.audio.done"
    response_id: str
    audio_ms: int


class ResponseDone(Event):
    type: Literal["response.done"] = "response.done"
    response_id: str
    status: Literal["completed", "cancelled", "failed"]
    text: str


class OutputAudioClear(Event):
    type: Literal["output_audio.clear"] = "output_audio.clear"
    response_id: str


class ErrorEvent(Event):
    type: Literal["error"] = "error"
    code: str
    message: str
    fatal: bool = False
    id: str | None = None
    retry_after_s: float | None = None
    """Set when trying again later may succeed (`capacity`, `rate_limited`,
    `quota_exceeded`): not before this many seconds."""

    @classmethod
    def of(
        cls, exc: VoiceAgentError, fatal: bool | None = None, id: str | None = None
    ) -> ErrorEvent:
        """The event that reports `exc` (`fatal` overrides the error's own flag)."""
        return cls(
            code=exc.code,
            message=exc.message,
            fatal=exc.fatal if fatal is None else fatal,
            id=id,
            retry_after_s=exc.retry_after_s,
        )


# ---------------------------------------------------------------- ASR stream


class AsrCommit(Event):
    type: Literal["commit"]


class AsrClose(Event):
    type: Literal["close"]


AsrClientEvent = Annotated[AsrCommit | AsrClose, Field(discriminator="type")]


class AsrReady(Event):
    type: Literal["ready"] = "ready"
    sample_rate: int


class SegmentStarted(Event):
    type: Literal["speech.started"] = "speech.started"
    segment_id: str
    start_ms: int


class SegmentPartial(Event):
    type: Literal["transcript.partial"] = "transcript.partial"
    segment_id: str
    text: str


class SegmentFinal(Event):
    type: Literal["transcript.final"] = "transcript.final"
    segment_id: str
    text: str
    start_ms: int
    end_ms: int
    language: str | None = None
    """The language the ASR heard (detected when the stream names none)."""


# ---------------------------------------------------------------- TTS stream

RequestId = Annotated[str, Field(min_length=1, max_length=128)]
"""The client's name for one `speak` request; `cancel` and the server's events carry it."""


class Speak(Event):
    type: Literal["speak"]
    id: RequestId
    text: Annotated[str, Field(max_length=100_000), NOT_BLANK]
    voice: str | None = Field(default=None, max_length=128)
    sample_rate: SampleRate | None = None
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    exaggeration: float | None = Field(default=None, ge=0.0, le=2.0)
    cfg_weight: float | None = Field(default=None, ge=0.0, le=2.0)
    temperature: float | None = Field(default=None, ge=0.05, le=2.0)


class CancelSpeak(Event):
    type: Literal["cancel"]
    id: RequestId


TtsClientEvent = Annotated[Speak | CancelSpeak, Field(discriminator="type")]


class TtsReady(Event):
    type: Literal["ready"] = "ready"


class AudioStart(Event):
    type: Literal["audio.start"] = "audio.start"
    id: str
    sample_rate: int


class AudioDone(Event):
    type: Literal["audio.done"] = "audio.done"
    id: str
    audio_ms: int
    status: Literal["completed", "cancelled"]


# ---------------------------------------------------------------- parsing

T = TypeVar("T")

CLIENT_EVENTS: TypeAdapter[ClientEvent] = TypeAdapter(ClientEvent)
ASR_CLIENT_EVENTS: TypeAdapter[AsrClientEvent] = TypeAdapter(AsrClientEvent)
TTS_CLIENT_EVENTS: TypeAdapter[TtsClientEvent] = TypeAdapter(TtsClientEvent)


def parse(adapter: TypeAdapter[T], text: str) -> T:
    """Parse one client text frame; anything malformed is InvalidMessage."""
    try:
        return parse_tagged(adapter, text)
    except InvalidMessage as exc:
        cause = exc.__cause__
        if isinstance(cause, ValidationError):
            first = cause.errors()[0]
            where = ".".join(str(p) for p in first["loc"][1:])
            if where.endswith("sample_rate") and first["type"] == "literal_error":
                raise UnsupportedSampleRate(f"{where}: {first['msg']}") from cause
        raise


def parse_tagged(
    adapter: TypeAdapter[T],
    text: str,
    tag: str = "type",
    error: type[InvalidMessage] = InvalidMessage,
    what: str = "message",
) -> T:
    """A JSON object told apart by its `tag` field, validated by `adapter` (a discriminated
    union); `error` (from the ValidationError, when that is the cause) says what is wrong,
    naming it `what`: the one way every wire here is parsed."""
    try:
        raw: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"not valid JSON: {exc.msg}") from exc
    except ValueError as exc:  # an integer of more digits than Python converts
        raise error(f"not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise error("not valid JSON: nested too deeply") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get(tag), str):
        raise error(f"a {what} must be a JSON object with a string `{tag}`")
    try:
        return adapter.validate_python(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        if first["type"] == "union_tag_invalid":
            raise error(f"unknown {what} {tag} {raw[tag]!r}") from exc
        where = ".".join(str(p) for p in first["loc"][1:]) or raw[tag]
        raise error(f"bad {raw[tag]!r} {what}: {where}: {first['msg']}") from exc
