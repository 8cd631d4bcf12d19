"""What both WebSocket protocols share: holding a slot for a session's life, reading the
client's socket ahead of the model, feeding it frames, taking what the model said."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from services.common.errors import VoiceAgentError
from services.common.service.routes import ServiceState
from services.common.service.ws import Channel, ReadAhead
from services.duplex import metrics
from services.duplex.engines.base import AudioF32, SlotOutput
from services.duplex.stepper import DuplexSlot, Stepper


class EngineFailed(VoiceAgentError):
    """A model step failed: the sessions in it end (close 1011)."""

    fatal = True


def new_session_id() -> str:
    return f"dup_{uuid.uuid4().hex[:16]}"


class DuplexSession:
    """One session's slot, seen from its connection."""

    def __init__(self, stepper: Stepper, slot: DuplexSlot) -> None:
        self.stepper = stepper
        self.slot = slot

    @property
    def id(self) -> str:
        return self.slot.session_id

    def leave(self) -> None:
        """Free the slot now (the client left): frames waiting for room are dropped."""
        self.stepper.leave(self.slot)

    async def hear(self, frames: list[AudioF32]) -> None:
        """Queue whole model frames (waits while the session's input is full)."""
        for frame in frames:
            await self.stepper.push(self.slot, frame)

    async def said(self) -> SlotOutput:
        """The next thing the model said for this session (one per step it took part in)."""
        item = await self.slot.output.get()
        self.stepper.taken(self.slot)
        if item is None:
            raise EngineFailed("the model failed on this session's frame; reconnect")
        return item


@asynccontextmanager
async def held_slot(
    stepper: Stepper, state: ServiceState, endpoint: str
) -> AsyncIterator[DuplexSession]:
    """A slot for the connection's life (CapacityError at once when there is none)."""
    slot = stepper.join(new_session_id())
    state.connection_opened()
    metrics.SESSIONS_OPENED.labels(endpoint).inc()
    try:
        yield DuplexSession(stepper, slot)
    finally:
        stepper.leave(slot)
        state.connection_closed()


async def read_ahead(channel: Channel, frames: ReadAhead, session: DuplexSession) -> None:
    """Read the client's socket into `frames` (a task beside the handling): its close is
    read and answered at once, whatever the handling waits for (room in the model's input,
    Redis), and the slot is freed then; the handling ends at its next `frames.get()`."""
    try:
        await frames.read(channel)
    finally:
        session.leave()
