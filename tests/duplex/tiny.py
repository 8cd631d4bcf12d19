"""Small random-weight Moshi engines for the tests (moshi's own classes, CPU, greedy)."""

from __future__ import annotations

from typing import Any

import numpy as np

from services.duplex.engines.base import StepInput
from services.duplex.engines.moshi import MoshiEngine, random_engine
from services.duplex.settings import DuplexSection, MoshiSettings, RandomMoshiSettings

SLOTS = 3


def section(**overrides: Any) -> DuplexSection:
    """A greedy `moshi-random` section on the CPU (the same input gives the same tokens)."""
    fields: dict[str, Any] = {
        "engine": "moshi-random",
        "use_sampling": False,
        "max_sessions": SLOTS,
        "random": RandomMoshiSettings(seed=7),
        "moshi": MoshiSettings(device="cpu"),
    }
    return DuplexSection(**(fields | overrides))


def tiny_engine(slots: int = SLOTS, **overrides: Any) -> MoshiEngine:
    engine = random_engine(section(max_sessions=slots, **overrides))
    engine.load(slots)
    return engine


def noise(frames: int, seed: int, frame_samples: int = 1920) -> np.ndarray:
    """`frames` frames of quiet noise (a stand-in for speech: the model is random anyway)."""
    rng = np.random.default_rng(seed)
    return (0.1 * rng.standard_normal((frames, frame_samples))).astype(np.float32)


def step(engine: MoshiEngine, frames: dict[int, np.ndarray], reset: set[int] = frozenset()) -> Any:  # type: ignore[assignment]
    """One step with `frames` (slot -> frame) active and `reset` slots reset first."""
    slots = engine._slots
    audio = np.zeros((slots, engine.frame_samples), np.float32)
    active = np.zeros(slots, bool)
    for slot, frame in frames.items():
        audio[slot], active[slot] = frame, True
    resets = np.array([slot in reset for slot in range(slots)])
    return engine.step(StepInput(audio, active, resets))
