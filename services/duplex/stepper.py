"""The one door to the model: every live session's frame goes through one batched step.

Each session holds a slot (its row in the model's batch) from admission to close. A step
runs whenever the model is free and some session has a whole frame waiting; it takes one
frame from every session that has one (and room for what comes back), so all live
sessions share each 80 ms step instead of queueing for the model one by one. Sessions
stepped last time that have no frame yet are waited for up to `gather_ms`, so a batch does
not split because one frame arrived a moment late; a session that is silent (or whose
client does not read) never holds the others up longer than that.

Sessions join and leave between steps: a new session's slot is reset by the step that
first takes it, and a step in flight when its session left has its output dropped.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from services.common.errors import CapacityError
from services.duplex import metrics
from services.duplex.engines.base import AudioF32, DuplexEngine, SlotOutput, StepInput

log = logging.getLogger(__name__)

FRAME_S = 0.08


@dataclass(eq=False)
class DuplexSlot:
    """A session's hold on one row of the batch: frames in, what the model said out."""

    index: int
    session_id: str
    max_input: int
    output: asyncio.Queue[SlotOutput | None]
    """What the model said, frame by frame; None: the engine failed (the session ends)."""
    frames: deque[tuple[AudioF32, float]] = field(default_factory=deque)
    needs_reset: bool = True
    closed: bool = False
    stepped: int = 0
    """Steps this session took part in."""
    space: asyncio.Event = field(default_factory=asyncio.Event)
    """Set while its input has room (a fast client waits on it: backpressure)."""

    def ready(self) -> bool:
        """A frame waits, and there is room for the answer."""
        return bool(self.frames) and not self.output.full()


class Stepper:
    """Slots, admission, and the loop that steps the engine."""

    def __init__(
        self,
        engine: DuplexEngine,
        slots: int,
        gather_ms: float,
        max_input_frames: int,
        max_output_frames: int,
        retry_after_s: float,
    ) -> None:
        self.engine = engine
        self.slots = slots
        self.gather_s = gather_ms / 1000
        self.max_input = max_input_frames
        self.max_output = max_output_frames
        self.retry_after_s = retry_after_s
        self.draining = False
        self.steps = 0
        self._live: dict[int, DuplexSlot] = {}
        self._last_batch: set[DuplexSlot] = set()
        self._wake = asyncio.Event()
        self._ids = itertools.count(1)

    @property
    def live(self) -> int:
        return len(self._live)

    def depth(self) -> int:
        """Frames waiting for the model, over all sessions."""
        return sum(len(slot.frames) for slot in self._live.values())

    def join(self, session_id: str) -> DuplexSlot:
        """A slot for a new session; CapacityError when every slot is taken or draining."""
        if self.draining:
            metrics.SESSIONS_REFUSED.labels("draining").inc()
            raise CapacityError(
                f"duplex service draining; retry after {self.retry_after_s:g} s",
                self.retry_after_s,
            )
        free = next((i for i in range(self.slots) if i not in self._live), None)
        if free is None:
            metrics.SESSIONS_REFUSED.labels("capacity").inc()
            raise CapacityError(
                f"duplex service at capacity ({self.slots} sessions); retry after "
                f"{self.retry_after_s:g} s",
                self.retry_after_s,
            )
        slot = DuplexSlot(free, session_id, self.max_input, asyncio.Queue(self.max_output))
        slot.space.set()
        self._live[free] = slot
        metrics.SESSIONS.set(len(self._live))
        return slot

    def leave(self, slot: DuplexSlot) -> None:
        """Free the slot now; a step in flight drops what it made for it, and a frame still
        waiting for room (`push`) is dropped at once."""
        slot.closed = True
        slot.space.set()
        if self._live.get(slot.index) is slot:
            del self._live[slot.index]
        self._last_batch.discard(slot)
        metrics.SESSIONS.set(len(self._live))
        self._wake.set()

    async def push(self, slot: DuplexSlot, frame: AudioF32) -> None:
        """Queue one whole frame; waits while the session's input is full."""
        while len(slot.frames) >= slot.max_input and not slot.closed:
            slot.space.clear()
            await slot.space.wait()
        if slot.closed:
            return
        slot.frames.append((frame, time.monotonic()))
        self._wake.set()

    def taken(self, slot: DuplexSlot) -> None:
        """The session's reader took an output: the slot may be ready again."""
        self._wake.set()

    async def run(self) -> None:
        """Step forever (a background task of the app)."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not any(slot.ready() for slot in self._live.values()):
                continue
            await self._gather()
            batch = [slot for slot in self._live.values() if slot.ready()]
            if batch:
                await self._step(batch)
                self._wake.set()  # more frames may be waiting

    async def _gather(self) -> None:
        """Wait (at most gather_ms) for the sessions of the last step that have room but no
        frame yet, so the batch stays whole."""
        deadline = time.monotonic() + self.gather_s
        while True:
            self._wake.clear()  # before looking: a frame pushed after the look wakes us
            late = [
                slot
                for slot in self._last_batch
                if not slot.closed and not slot.frames and not slot.output.full()
            ]
            left = deadline - time.monotonic()
            if not late or left <= 0:
                return
            try:
                async with asyncio.timeout(left):
                    await self._wake.wait()
            except TimeoutError:
                return

    async def _step(self, batch: list[DuplexSlot]) -> None:
        audio = np.zeros((self.slots, self.engine.frame_samples), np.float32)
        active = np.zeros(self.slots, bool)
        reset = np.zeros(self.slots, bool)
        now = time.monotonic()
        for slot in batch:
            frame, since = slot.frames.popleft()
            slot.space.set()
            metrics.FRAME_WAIT.observe(now - since)
            audio[slot.index], active[slot.index] = frame, True
            reset[slot.index], slot.needs_reset = slot.needs_reset, False
        started = time.perf_counter()
        try:
            result = await asyncio.to_thread(self.engine.step, StepInput(audio, active, reset))
        except Exception:
            log.exception("a duplex step failed; its %d session(s) end", len(batch))
            metrics.STEP_FAILURES.inc()
            for slot in batch:
                slot.needs_reset = True
                if not slot.closed:
                    slot.output.put_nowait(None)
            return
        took = time.perf_counter() - started
        self.steps += 1
        metrics.STEP_SECONDS.observe(took)
        metrics.STEP_BATCH.observe(len(batch))
        if took > FRAME_S:
            metrics.LATE_STEPS.inc()
        self._last_batch = set(batch)
        for slot in batch:
            said = result.slots[slot.index]
            slot.stepped += 1
            if said is not None and not slot.closed:
                slot.output.put_nowait(said)
