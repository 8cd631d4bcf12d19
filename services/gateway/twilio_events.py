"""Twilio Media Streams' WebSocket messages (bidirectional, `<Connect><Stream>`), parsed once.

Twilio sends `connected`, `start`, `media` (base64 mu-law at 8 kHz), `mark` (one the server
sent, back once the audio before it has played, or was cleared), `dtmf` and `stop`; the
server sends `media`, `mark` and `clear`. Only what the gateway acts on is modelled;
unknown fields are ignored. See docs/telephony.md.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

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
