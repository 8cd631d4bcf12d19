"""The ASR engine protocol: what every speech recognizer offers the batcher."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

AudioF32 = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class AsrInput:
    """One utterance: mono float32 samples in [-1, 1] at the engine's sample rate."""

    audio: AudioF32
    language: str | None = None


@dataclass(frozen=True, slots=True)
class Transcript:
    """The result for one utterance."""

    text: str
    language: str | None = None
    duration_s: float = 0.0
    segments: list[dict[str, float | str]] = field(default_factory=list)
    avg_logprob: float | None = None
    """The engine's mean log-probability of the text's tokens (None: it does not say, or no
    words). Clear speech heard right scores about -0.3 to 0; a misheard fragment lower."""
    last_word_logprob: float | None = None
    """The engine's log-probability of the last word it wrote (None: it does not say, or
    no words). Near 0: sure; a misheard last word scores low (docs/turn-taking.md)."""


class Interrupted(Exception):
    """An interruptible call gave up because its `stop` event was set."""


class AsrEngine(Protocol):
    """A speech recognizer. `load` and `transcribe_batch` block: call them off the event loop."""

    name: str
    sample_rate: int
    model: str
    device: str

    def load(self) -> None:
        """Load the model; raise EngineUnavailable with the fix in the message if it cannot."""

    def transcribe_batch(self, items: Sequence[AsrInput]) -> list[Transcript]:
        """Transcribe every item; the result list is in the same order."""
        ...


@runtime_checkable
class InterruptibleEngine(AsrEngine, Protocol):
    """An engine that can abandon a call part-way (so a final never waits for a partial)."""

    def transcribe_batch_until(
        self, items: Sequence[AsrInput], stop: threading.Event
    ) -> list[Transcript]:
        """As `transcribe_batch`, but raise Interrupted soon after `stop` is set."""
        ...
