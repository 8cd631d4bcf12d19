"""The `/v1/stream/duplex` wire messages (docs/duplex.md), parsed once at the edge."""

from __future__ import annotations

from typing import Literal

from pydantic import TypeAdapter

from services.common.protocol.events import Event, parse


class DuplexReady(Event):
    """First message: the session holds a slot; audio may flow both ways from now on."""

    type: Literal["ready"] = "ready"
    session_id: str
    input_sample_rate: int
    output_sample_rate: int
    frame_ms: int = 80
    engine: str
    model: str


class TextDelta(Event):
    """A text piece the agent produced; `audio_ms` is where its frame starts in the agent's
    audio sent so far (the frame with the same step follows this message)."""

    type: Literal["text.delta"] = "text.delta"
    delta: str
    audio_ms: int


class DuplexClose(Event):
    """The client ends the session; the server closes with 1000."""

    type: Literal["close"]


DUPLEX_CLIENT_EVENTS: TypeAdapter[DuplexClose] = TypeAdapter(DuplexClose)


def parse_client(text: str) -> DuplexClose:
    """One client text frame; anything else than `close` is InvalidMessage."""
    return parse(DUPLEX_CLIENT_EVENTS, text)
