"""Twilio Media Streams' WebSocket messages (bidirectional, `<Connect><Stream>`), parsed once.

Twilio sends `connected`, `start`, `media` (base64 mu-law at 8 kHz), `mark` (one the server
sent, back once the audio before it has played, or was cleared), `dtmf` and `stop`; the
server sends `media`, `mark` and `clear`. Only what the gateway acts on is modelled;
unknown fields are ignored. Before all that, Twilio signs the WebSocket upgrade
(`X-Twilio-Signature`, `signed_by_twilio`). See docs/telephony.md.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from services.common.errors import InvalidMessage
from services.common.protocol.events import parse_tagged


class TwilioError(InvalidMessage):
    """A message from Twilio the gateway cannot use: logged and counted, never fatal."""

    code = "invalid_twilio_message"


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore")


class MediaFormat(_Loose):
    """Twilio's field names, camelCase as it sends them."""

    encoding: str = "audio/x-mulaw"
    sampleRate: int = 8000
    channels: int = 1


class StartInfo(_Loose):
    streamSid: str = Field(max_length=64)
    accountSid: str = Field(default="", max_length=64)
    callSid: str = Field(default="", max_length=64)
    tracks: list[str] = Field(default_factory=lambda: ["inbound"], max_length=4)
    customParameters: dict[str, str] = Field(default_factory=dict, max_length=32)
    mediaFormat: MediaFormat = Field(default_factory=MediaFormat)


class MediaInfo(_Loose):
    track: str = "inbound"
    chunk: str | None = None
    timestamp: str | None = None
    payload: str = Field(max_length=400_000)  # base64 of at most ~37 s of mu-law


class MarkInfo(_Loose):
    name: str = Field(max_length=256)


class Connected(_Loose):
    event: Literal["connected"]
    protocol: str | None = None
    version: str | None = None


class Start(_Loose):
    event: Literal["start"]
    start: StartInfo


class Media(_Loose):
    event: Literal["media"]
    media: MediaInfo


class Mark(_Loose):
    event: Literal["mark"]
    mark: MarkInfo


class Dtmf(_Loose):
    event: Literal["dtmf"]


class Stop(_Loose):
    event: Literal["stop"]


TwilioMessage = Annotated[
    Connected | Start | Media | Mark | Dtmf | Stop, Field(discriminator="event")
]
_ADAPTER: TypeAdapter[TwilioMessage] = TypeAdapter(TwilioMessage)
EVENTS = ("connected", "start", "media", "mark", "dtmf", "stop")


def parse(text: str) -> TwilioMessage:
    """One message from Twilio; TwilioError says what is wrong with it."""
    return parse_tagged(_ADAPTER, text, tag="event", error=TwilioError, what="Twilio message")


def media(stream_sid: str, payload: str) -> str:
    """Audio for the caller: base64 mu-law at 8 kHz."""
    return json.dumps({"event": "media", "streamSid": stream_sid, "media": {"payload": payload}})


def mark(stream_sid: str, name: str) -> str:
    """A mark after the audio sent so far: Twilio sends it back once that has played."""
    return json.dumps({"event": "mark", "streamSid": stream_sid, "mark": {"name": name}})


def clear(stream_sid: str) -> str:
    """Drop the audio Twilio still holds for the caller (barge-in)."""
    return json.dumps({"event": "clear", "streamSid": stream_sid})


SIGNATURE_HEADER = "x-twilio-signature"
_DEFAULT_PORTS = {"wss": 443, "https": 443, "ws": 80, "http": 80}


def signature(auth_token: str, url: str) -> str:
    """Twilio's `X-Twilio-Signature` of a request with no form fields (a WebSocket upgrade
    is a GET): base64 of HMAC-SHA1 over the full URL, keyed with the account's auth token."""
    digest = hmac.new(auth_token.encode(), url.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def signed_urls(url: str) -> list[str]:
    """The forms of `url` Twilio may have signed: as written, and with and without the
    scheme's default port (its helper libraries accept both: Twilio has signed either)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
    forms = [url, parts._replace(netloc=host).geturl()]
    if port is not None:
        forms.append(parts._replace(netloc=f"{host}:{port}").geturl())
    return list(dict.fromkeys(forms))


def signed_by_twilio(auth_token: str, url: str, given: str | None) -> bool:
    """Whether `given` (the upgrade's `X-Twilio-Signature`) is Twilio's signature of `url`,
    compared in constant time. A missing or empty one never is."""
    if not given:
        return False
    received = given.strip().encode("latin-1", "replace")
    matches = [
        hmac.compare_digest(signature(auth_token, form).encode("ascii"), received)
        for form in signed_urls(url)
    ]
    return any(matches)
