"""The TTS engine protocol: what every synthesizer offers the TTS service."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

AudioF32 = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class SpeechRequest:
    """One text chunk to speak. `voice` is an engine voice id (already resolved)."""

    text: str
    voice: str
    speed: float = 1.0
    exaggeration: float | None = None
    cfg_weight: float | None = None
    temperature: float | None = None


class TtsEngine(Protocol):
    """A speech synthesizer. `load` and iterating `synthesize` block: run them off the loop.

    `synthesize` yields mono float32 chunks in [-1, 1] at `sample_rate` as soon as
    they exist; the caller may stop iterating between chunks to cancel.
    """

    name: str
    sample_rate: int
    model: str
    device: str
    default_voice: str

    def load(self) -> None:
        """Load the model; raise EngineUnavailable with the fix in the message if it cannot."""

    def voices(self) -> list[str]:
        """The voice ids this engine accepts."""
        ...

    def synthesize(self, request: SpeechRequest) -> Iterator[AudioF32]:
        """Yield audio chunks for one request."""
        ...


TtsEngineFactory = Callable[..., TtsEngine]
