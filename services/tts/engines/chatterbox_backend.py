"""The contract between the chatterbox engine and its torch backend: the backend protocol
and how one request's speech tokens are sampled. Both chatterbox.py (the engine, no torch)
and chatterbox_torch.py (the backend, torch) import it; neither imports the other at module
level."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from services.tts.engines.base import AudioF32, SpeechRequest
from services.tts.settings import ChatterboxSettings


@dataclass(frozen=True, slots=True)
class Sampling:
    """How one request's speech tokens are sampled."""

    exaggeration: float
    cfg_weight: float
    temperature: float
    min_p: float
    top_p: float
    repetition_penalty: float
    max_new_tokens: int


class SpeechBackend(Protocol):
    """A loaded chatterbox model, driven step by step. Every call runs on the model."""

    sample_rate: int
    builtin_conds: Any
    """The model's own voice (`conds.pt`), or None."""

    def prepare(self, clip: Path, exaggeration: float) -> Any:
        """The conditioning of a reference clip."""
        ...

    def tokens(self, conds: Any, text: str, sampling: Sampling) -> Iterator[int]:
        """Speech tokens, one per `next()` (one T3 step each), until the end of speech."""
        ...

    def render(self, conds: Any, tokens: Sequence[int], final: bool) -> AudioF32:
        """S3Gen audio of `tokens`; unless `final`, the last 3 tokens are left out."""
        ...


def sampling_of(settings: ChatterboxSettings, request: SpeechRequest) -> Sampling:
    """The request's sampling: its own style where it sets one, the settings' otherwise."""
    return Sampling(
        exaggeration=_pick(request.exaggeration, settings.exaggeration),
        cfg_weight=_pick(request.cfg_weight, settings.cfg_weight),
        temperature=_pick(request.temperature, settings.temperature),
        min_p=settings.min_p,
        top_p=settings.top_p,
        repetition_penalty=settings.repetition_penalty,
        max_new_tokens=settings.max_new_tokens,
    )


def _pick(value: float | None, default: float) -> float:
    return default if value is None else value
