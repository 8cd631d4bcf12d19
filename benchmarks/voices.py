"""The voices benchmarks speak with: espeak-ng (tests/speech.py) and the packaged Piper voice."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from tests.speech import piper_speech, speak

Audio = npt.NDArray[np.float32]
Voice = Callable[[str], Audio]
RATE = 16000


def piper(speed: float, rate: int = RATE) -> Voice:
    """Piper's joe voice at `speed`, resampled to `rate`."""

    return lambda text: piper_speech(text, rate, speed, deterministic=False)


def espeak(voice: str, wpm: int, rate: int = RATE) -> Voice:
    """An espeak-ng voice at `wpm` words per minute, with a microphone's dither."""
    return lambda text: speak(text, rate, voice, wpm)
