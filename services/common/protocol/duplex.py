"""The `/v1/stream/duplex` wire messages (docs/duplex.md), parsed once at each edge.

A contract between two services: the duplex service speaks it, a gateway whose backend is
`duplex` is its client. It lives here, below both, so neither imports the other.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, TypeAdapter

from services.common.protocol.events import ErrorEvent, Event, parse


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


DuplexServerEvent = Annotated[DuplexReady | TextDelta | ErrorEvent, Field(discriminator="type")]
"""What the service sends as text (its audio comes as binary frames)."""

DUPLEX_CLIENT_EVENTS: TypeAdapter[DuplexClose] = TypeAdapter(DuplexClose)
DUPLEX_SERVER_EVENTS: TypeAdapter[DuplexServerEvent] = TypeAdapter(DuplexServerEvent)


def parse_client(text: str) -> DuplexClose:
    """One client text frame; anything else than `close` is InvalidMessage."""
    return parse(DUPLEX_CLIENT_EVENTS, text)


def parse_server(text: str) -> DuplexServerEvent:
    """One server text frame (the gateway's side); anything else is InvalidMessage."""
    return parse(DUPLEX_SERVER_EVENTS, text)
