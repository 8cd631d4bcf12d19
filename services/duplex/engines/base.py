"""The duplex engine protocol: one batched step of a speech-to-speech model over many slots.

A Moshi-family model hears and speaks at once, one 80 ms frame at a time. The service keeps
a fixed number of slots (its `max_sessions`); each step takes one frame from every slot
that has one and returns what each of those slots says back. Slots left out of a step keep
their state as it was, and a slot given to a new session is reset before its first step,
so one session's conversation never sees another's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

AudioF32 = npt.NDArray[np.float32]
Mask = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class StepInput:
    """One step: a frame per slot (rows of slots that do not step are ignored)."""

    audio: AudioF32
    """[slots, frame_samples] mono float32 in [-1, 1] at the engine's sample rate."""
    active: Mask
    """[slots] the slots that step now."""
    reset: Mask
    """[slots] the slots to reset before this step (a new session took them)."""


@dataclass(frozen=True, slots=True)
class SlotOutput:
    """What one slot said in one step."""

    audio: AudioF32 | None
    """The agent's frame (frame_samples), or None when the model made none this step (the
    first steps of a session, while the model's delayed codebooks fill)."""
    text: str | None = None
    """The text piece the agent produced with it (None: padding, no word)."""
    codes: tuple[int, ...] | None = None
    """The step's tokens (text first, then the agent's audio codebooks), when the engine has
    them: what determinism and isolation are checked on."""


@dataclass(frozen=True, slots=True)
class StepOutput:
    """One entry per slot; slots that did not step have None."""

    slots: list[SlotOutput | None]


@runtime_checkable
class DuplexEngine(Protocol):
    """A full-duplex speech model driven frame by frame over a batch of slots."""

    name: str
    model: str
    device: str
    sample_rate: int
    """Rate of the audio in and out (Mimi: 24 000 Hz)."""
    frame_samples: int
    """Samples per frame (Mimi: 1920, 80 ms)."""

    def load(self, slots: int) -> None:
        """Load the model and allocate the streaming state of `slots` slots. Blocking."""
        ...

    def step(self, batch: StepInput) -> StepOutput:
        """Run one frame for the active slots. Blocking: call it off the event loop."""
        ...

    def state_bytes_per_slot(self) -> int:
        """Bytes of streaming state (KV caches, codec buffers) one slot holds."""
        ...


def empty_output(slots: int) -> StepOutput:
    """A step in which no slot said anything."""
    return StepOutput([None] * slots)
