"""The seam between a wire format and the session: codecs, and the one session channel.

A `Codec` turns a client's frames into typed inputs (native client events and audio) and
typed server events into frames; `SessionChannel` does the socket I/O around it. The
session only ever sees typed inputs and sends typed events, whatever the client speaks:
`/v1/stream` (`NativeCodec`), `/v1/realtime` (OpenAI Realtime, `realtime.RealtimeCodec`),
`/v1/twilio` (Twilio Media Streams, `twilio.TwilioCodec`), or any other format a codec is
written for. Audio codings (PCM16, G.711) are undone here too (`WireAudio`): the session
only ever sees PCM16. Errors are encoded once, at this edge, with their `fatal` flag.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

from services.common import metrics
from services.common.audio import g711
from services.common.errors import VoiceAgentError
from services.common.protocol.events import (
    CLIENT_EVENTS,
    AudioEncoding,
    ClientEvent,
    ErrorEvent,
    Event,
    SessionCreated,
    SessionUpdated,
    parse,
)
from services.common.service.ws import Channel, Frame

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AudioIn:
    """Microphone audio: PCM16 little-endian at the session's input rate (at most 1 s)."""

    pcm: bytes


@dataclass(frozen=True, slots=True)
class AudioPlayed:
    """The client says a reply's audio has played up to here (PCM16 bytes at the output
    rate): Twilio's marks coming back. Such a codec sets `confirms_playout`."""

    response_id: str
    played_bytes: int


@dataclass(frozen=True, slots=True)
class UserItem:
    """User text added to the conversation and not answered yet (Realtime's
    `conversation.item.create`): a later response, or the next voice turn's, answers it."""

    text: str


ClientInput = ClientEvent | AudioIn | AudioPlayed | UserItem
"""What a codec makes of a client frame, for the session."""
Outgoing = str | bytes
"""A frame for the client: text or binary."""


@dataclass
class Decoded:
    """One client frame, decoded: inputs for the session, and frames that answer the
    client at once (acknowledgements a wire format defines, such as Realtime's)."""

    inputs: list[ClientInput] = field(default_factory=list)
    replies: list[Outgoing] = field(default_factory=list)


class WireAudio:
    """The session's audio codings as the client sent them last (`session.created` and
    `session.updated` say): PCM16 passes through, G.711 is decoded to and encoded from PCM16
    by table (services/common/audio/g711.py: nothing held back). A reply's audio is coded
    as its own settings say (`from_pcm`'s `coding`): one asked for while it plays applies
    from the next reply, whose audio is made at the new rate."""

    def __init__(self, given: AudioEncoding = "pcm16", sent: AudioEncoding = "pcm16") -> None:
        self.given = given
        self.sent = sent

    def follow(self, event: Event) -> None:
        if isinstance(event, SessionCreated | SessionUpdated):
            self.given, self.sent = event.session.input_format, event.session.output_format

    def to_pcm(self, data: bytes) -> bytes:
        """Client audio → PCM16."""
        return data if self.given == "pcm16" else g711.decode(data, self.given)

    def from_pcm(self, pcm: bytes, coding: AudioEncoding | None = None) -> bytes:
        """PCM16 → `coding` (None: the session's output coding now)."""
        coding = coding or self.sent
        return pcm if coding == "pcm16" else g711.encode(pcm, coding)


class Codec(Protocol):
    """A wire format. Decoding a frame the format refuses raises a VoiceAgentError.
    `confirms_playout`: the client reports what has played (`AudioPlayed`), so what the user
    heard of a reply is what it confirmed, not what the clock says."""

    confirms_playout: bool

    def decode(self, frame: Frame) -> Decoded: ...

    def encode(self, event: Event) -> list[Outgoing]: ...

    def encode_audio(self, pcm: bytes, coding: AudioEncoding | None = None) -> list[Outgoing]: ...

    def encode_error(
        self, exc: VoiceAgentError, fatal: bool, answering: bool = False
    ) -> list[Outgoing]:
        """`answering`: the error answers the client frame just decoded (its handling
        raised it), not something that happened meanwhile (a reply's agent failing)."""
        ...


class NativeCodec:
    """`/v1/stream`: JSON client events and binary audio frames (PCM16, or G.711 once the
    session's formats say so: docs/protocol.md)."""

    confirms_playout = False

    def __init__(self) -> None:
        self.audio = WireAudio()

    def decode(self, frame: Frame) -> Decoded:
        if frame.data is not None:
            return Decoded([AudioIn(self.audio.to_pcm(frame.data))])
        return Decoded([parse(CLIENT_EVENTS, frame.text or "")])

    def encode(self, event: Event) -> list[Outgoing]:
        self.audio.follow(event)
        return [event.dump()]

    def encode_audio(self, pcm: bytes, coding: AudioEncoding | None = None) -> list[Outgoing]:
        return [self.audio.from_pcm(pcm, coding)]

    def encode_error(
        self, exc: VoiceAgentError, fatal: bool, answering: bool = False
    ) -> list[Outgoing]:
        return [ErrorEvent.of(exc, fatal).dump()]


class SessionChannel:
    """A session's WebSocket: socket I/O (`Channel`) with a codec on both directions."""

    def __init__(self, io: Channel, codec: Codec) -> None:
        self.io = io
        self.codec = codec

    @property
    def closed(self) -> bool:
        return self.io.closed

    async def receive(self) -> list[ClientInput]:
        """The inputs of the next client frame that has any. A frame the codec refuses
        costs an error event (the connection goes on, unless the error is fatal)."""
        while True:
            inputs = await self.decode(await self.io.receive())
            if inputs:
                return inputs

    async def decode(self, frame: Frame) -> list[ClientInput]:
        """One frame's inputs (none, for a frame the codec refused: that costs an error
        event, and the connection goes on unless the error is fatal)."""
        try:
            decoded = self.codec.decode(frame)
        except VoiceAgentError as exc:
            if exc.fatal:
                raise
            await self.send_error(exc, answering=True)
            return []
        await self._send_all(decoded.replies)
        return decoded.inputs

    async def send(self, event: Event) -> None:
        await self._send_all(self.codec.encode(event))

    async def send_audio(self, data: bytes, coding: AudioEncoding | None = None) -> None:
        """PCM16 out, coded as `coding` (a reply's own) or as the session's output now."""
        await self._send_all(self.codec.encode_audio(data, coding))

    async def send_error(
        self, exc: VoiceAgentError, fatal: bool | None = None, answering: bool = False
    ) -> None:
        """Report a domain error (and count it); `fatal` overrides the error's own flag;
        `answering`: it answers the client frame being handled (Codec.encode_error)."""
        metrics.ERRORS.labels(self.io.service, exc.code).inc()
        fatal = exc.fatal if fatal is None else fatal
        await self._send_all(self.codec.encode_error(exc, fatal, answering))

    async def close(self, code: int = 1000, reason: str = "") -> None:
        await self.io.close(code, reason)

    async def fail(self, exc: VoiceAgentError) -> None:
        """A fatal error: tell the client, then close with the error's close code."""
        await self.send_error(exc)
        await self.close(exc.close_code, exc.message)

    async def _send_all(self, frames: list[Outgoing]) -> None:
        for frame in frames:
            if isinstance(frame, bytes):
                await self.io.send_bytes(frame)
            else:
                await self.io.send_text(frame)
