"""The voices benchmarks speak with: espeak-ng (tests/speech.py) and the packaged Piper voice."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import numpy as np
import numpy.typing as npt

from services.common.audio.pcm import resample
from services.tts.engines.base import SpeechRequest
from services.tts.engines.piper import PiperEngine
from services.tts.settings import PiperSettings
from tests.speech import speak

Audio = npt.NDArray[np.float32]
Voice = Callable[[str], Audio]
RATE = 16000


@cache
def _piper() -> PiperEngine:
    engine = PiperEngine(PiperSettings())
    engine.load()
    return engine


def piper(speed: float, rate: int = RATE) -> Voice:
    """Piper's joe voice at `speed`, resampled to `rate`."""

    def say(text: str) -> Audio:
        request = SpeechRequest(text=text, voice="joe", speed=speed)
        audio = np.concatenate(list(_piper().synthesize(request)))
        return resample(audio, _piper().sample_rate, rate)

    return say


def espeak(voice: str, wpm: int, rate: int = RATE) -> Voice:
    """An espeak-ng voice at `wpm` words per minute, with a microphone's dither."""
    return lambda text: speak(text, rate, voice, wpm)
