"""`/v1/twilio`: a phone call through Twilio Media Streams, as a codec over the Session.

`TwilioCodec` is a `Codec` (services/gateway/codec.py). Inbound, `media` payloads (base64
mu-law at 8 kHz) become PCM16 `AudioIn` frames, `stop` closes the session, and the marks
Twilio sends back become `AudioPlayed` inputs: each audio frame the gateway sends is
followed by a mark named after its reply and the bytes sent so far, so when the caller
barges in, the reply keeps what the last mark back says was heard (`confirms_playout`).
Outbound, audio becomes `media` + `mark`, a cleared reply `clear`; the Session's other
events have no Twilio message and are dropped. A message Twilio should not have sent costs
a log line and a count, never the call.

Before its `start`, a stream whose credential is still to come waits in the `WaitingRoom`:
a few at once, fewer still from one address unless Twilio signed the upgrade, so anonymous
sockets cannot crowd out callers. See docs/telephony.md.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import logging
from collections import Counter

from services.common.errors import VoiceAgentError
from services.common.protocol.events import (
    AudioEncoding,
    ErrorEvent,
    Event,
    OutputAudioClear,
    ResponseCreated,
    SessionClose,
)
from services.common.service.ws import Disconnected, Frame
from services.gateway import metrics
from services.gateway import twilio_events as tw
from services.gateway.codec import (
    AudioIn,
    AudioPlayed,
    ClientInput,
    Decoded,
    Outgoing,
    SessionChannel,
    WireAudio,
)

log = logging.getLogger(__name__)

TWILIO_SESSION: dict[str, object] = {
    "input_sample_rate": 8000,
    "output_sample_rate": 8000,
    "input_format": "pcmu",
    "output_format": "pcmu",
}
"""A call's session: mu-law at 8 kHz both ways (Twilio's one format)."""
_ENCODINGS = {"audio/x-mulaw": "pcmu"}
_SECOND = 2 * 8000  # PCM16 bytes of one second: the Session's largest frame


class TwilioCodec:
    """Twilio's messages to the Session's inputs, and its events to Twilio's messages."""

    confirms_playout = True

    def __init__(self) -> None:
        self.audio = WireAudio("pcmu", "pcmu")
        self.stream_sid: str | None = None
        self.call_sid = ""
        self.parameters: dict[str, str] = {}
        """The `<Parameter>`s of the call's `<Stream>` (its `customParameters`)."""
        self.start_refused = False
        """The `start` named a media format the gateway does not take: the call cannot go on."""
        self._reply: str | None = None  # the reply whose audio is going out
        self._sent = 0  # its PCM16 bytes sent so far

    # ------------------------------------------------------------ Twilio → Session

    def decode(self, frame: Frame) -> Decoded:
        """Counted by event once used; a message refused is counted as `invalid`."""
        try:
            if frame.data is not None:
                raise tw.TwilioError("Twilio sends JSON text frames, not binary ones")
            message = tw.parse(frame.text or "")
            decoded = self._use(message)
        except tw.TwilioError:
            metrics.TWILIO_MESSAGES.labels("invalid").inc()
            raise
        metrics.TWILIO_MESSAGES.labels(message.event).inc()
        return decoded

    def _use(self, message: tw.TwilioMessage) -> Decoded:
        match message:
            case tw.Start():
                self._start(message.start)
            case tw.Media():
                return Decoded(self._media(message.media))
            case tw.Mark():
                return Decoded(self._mark(message.mark.name))
            case tw.Stop():
                return Decoded([SessionClose(type="session.close")])
        return Decoded()  # connected, dtmf

    def _start(self, start: tw.StartInfo) -> None:
        if self.stream_sid is not None:
            raise tw.TwilioError(f"a second start on stream {self.stream_sid}")
        fmt = start.mediaFormat
        if _ENCODINGS.get(fmt.encoding) is None or fmt.sampleRate != 8000 or fmt.channels != 1:
            self.start_refused = True
            raise tw.TwilioError(
                f"start.mediaFormat {fmt.encoding} {fmt.sampleRate} Hz x{fmt.channels}: "
                "only audio/x-mulaw at 8000 Hz, mono"
            )
        self.stream_sid, self.call_sid = start.streamSid, start.callSid
        self.parameters = dict(start.customParameters)
        log.info("twilio stream %s of call %s started", self.stream_sid, self.call_sid)

    def _media(self, media: tw.MediaInfo) -> list[ClientInput]:
        if self.stream_sid is None:
            raise tw.TwilioError("media before start")
        if media.track not in ("inbound", "inbound_track"):
            return []
        try:
            data = base64.b64decode(media.payload, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise tw.TwilioError("media.payload is not valid base64") from exc
        if not data:
            raise tw.TwilioError("media.payload holds no audio")
        pcm = self.audio.to_pcm(data)
        return [AudioIn(pcm[at : at + _SECOND]) for at in range(0, len(pcm), _SECOND)]

    def _mark(self, name: str) -> list[ClientInput]:
        response_id, _, played = name.rpartition(":")
        if not response_id or not played.isdigit():
            return []  # not one of ours
        return [AudioPlayed(response_id, int(played))]

    # ------------------------------------------------------------ Session → Twilio

    def encode(self, event: Event) -> list[Outgoing]:
        self.audio.follow(event)
        match event:
            case ResponseCreated():
                self._reply, self._sent = event.response_id, 0
            case OutputAudioClear() if self.stream_sid is not None:
                return [tw.clear(self.stream_sid)]
            case ErrorEvent():
                log.warning("twilio stream %s: %s: %s", self.stream_sid, event.code, event.message)
        return []

    def encode_audio(self, pcm: bytes, coding: AudioEncoding | None = None) -> list[Outgoing]:
        if self.stream_sid is None or self._reply is None:
            return []
        self._sent += len(pcm)
        payload = base64.b64encode(self.audio.from_pcm(pcm, coding)).decode("ascii")
        name = f"{self._reply}:{self._sent}"
        return [tw.media(self.stream_sid, payload), tw.mark(self.stream_sid, name)]

    def encode_error(
        self, exc: VoiceAgentError, fatal: bool, answering: bool = False
    ) -> list[Outgoing]:
        """Twilio has no error message: the log says, the error count counts."""
        log.warning(
            "twilio stream %s: %s%s: %s",
            self.stream_sid,
            exc.code,
            " (fatal)" if fatal else "",
            exc.message,
        )
        return []


async def wait_for_start(channel: SessionChannel, codec: TwilioCodec, timeout_s: float) -> bool:
    """Read the stream's first messages until its `start` (True), or until it stops, leaves,
    starts in a format the gateway does not take, or keeps silent for `timeout_s` (False).
    Malformed messages cost an error count."""
    try:
        async with asyncio.timeout(timeout_s):
            while codec.stream_sid is None:
                try:
                    frame = await channel.io.receive()
                except Disconnected:
                    return False
                try:
                    decoded = codec.decode(frame)
                except VoiceAgentError as exc:
                    await channel.send_error(exc)
                    if codec.start_refused:
                        return False
                    continue
                if any(isinstance(item, SessionClose) for item in decoded.inputs):
                    return False
    except TimeoutError:
        log.warning("twilio stream sent no start in %.1f s: closed", timeout_s)
        return False
    return True


def peer_key(host: str | None) -> str:
    """The address a stream's waiting is counted under: the peer's IPv4 address, or its
    IPv6 address's /64 (one host is given a whole /64 to pick addresses from)."""
    try:
        address = ipaddress.ip_address(host or "")
    except ValueError:
        return host or "unknown"
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class WaitingRoom:
    """Phone streams accepted before their credential (it comes in `start`): at most
    `limit` at once, and at most `per_address` from one `peer_key` unless the upgrade
    carried Twilio's signature (Twilio's media servers are a few addresses for all calls)."""

    def __init__(self, limit: int, per_address: int) -> None:
        self.limit = limit
        self.per_address = per_address
        self._waiting: dict[object, str | None] = {}  # stream → its peer key (None: signed)
        self._by_address: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._waiting)

    def refusal(self, host: str | None, signed: bool) -> str | None:
        """Why a stream from `host` may not wait now (a metrics reason), or None."""
        if len(self._waiting) >= self.limit:
            return "unverified"
        if not signed and self._by_address[peer_key(host)] >= self.per_address:
            return "unverified_address"
        return None

    def enter(self, stream: object, host: str | None, signed: bool) -> None:
        key = None if signed else peer_key(host)
        self._waiting[stream] = key
        if key is not None:
            self._by_address[key] += 1

    def leave(self, stream: object) -> None:
        """The stream has its seat, or has gone (a stream not waiting is ignored)."""
        key = self._waiting.pop(stream, None)
        if key is not None:
            self._by_address[key] -= 1
            if not self._by_address[key]:
                del self._by_address[key]
