"""The TTS engine protocol: what every synthesizer offers the TTS service."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

AudioF32 = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class SpeechRequest:
    """One text chunk to speak. `voice` is an engine voice id (already resolved).

    `should_stop`, when given, is polled between steps: an engine that can stop
    mid-chunk (chatterbox's token loop) stops as soon as it returns True.
    """

    text: str
    voice: str
    speed: float = 1.0
    exaggeration: float | None = None
    cfg_weight: float | None = None
    temperature: float | None = None
    continues: bool = False
    """The text stops inside a sentence that the next request goes on with: an engine that
    can ends it on a short pause, not a sentence's."""
    should_stop: Callable[[], bool] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class LibraryVoice:
    """A voice of the voice library: its reference clip (on this host) and engine hints."""

    id: str
    clip: Path
    espeak_voice: str | None = None
    """The espeak-ng voice that stands in for it (espeak cannot clone a voice)."""
    piper_voice: str | None = None
    """The Piper voice that stands in for it (Piper cannot clone a voice either)."""


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
        """The voice ids this engine lists by name (library voices are not listed)."""
        ...

    def has_voice(self, voice: str) -> bool:
        """Whether the engine speaks with `voice` by name (cheap: called per request)."""
        ...

    def library_voice(self, voice: LibraryVoice) -> str:
        """The engine voice id that speaks for a library voice. Cheap: no model work."""
        ...

    def prepare_voice(self, voice: str) -> None:
        """Build and cache what a voice needs now (blocking); a no-op where nothing is."""

    def forget_voice(self, voice: str) -> None:
        """Drop whatever is cached for a voice (its clip was deleted)."""

    def synthesize(self, request: SpeechRequest) -> Iterator[AudioF32]:
        """Yield audio chunks for one request."""
        ...
