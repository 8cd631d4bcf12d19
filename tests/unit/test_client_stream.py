"""The stream client's own arithmetic: where the speech in a recording ends."""

from __future__ import annotations

import numpy as np
import pytest

from services.client.stream import trailing_silence_s


def test_trailing_silence_is_what_follows_the_last_loud_sample() -> None:
    speech = np.full(8000, 0.2, np.float32)
    hiss = np.full(4000, 0.005, np.float32)  # -46 dBFS: quiet enough to be silence
    audio = np.concatenate([np.zeros(1600, np.float32), speech, hiss, np.zeros(12_000, np.float32)])
    assert trailing_silence_s(audio, 16000) == pytest.approx(1.0)
    assert trailing_silence_s(speech, 16000) == 0.0
    assert trailing_silence_s(np.zeros(3200, np.float32), 16000) == pytest.approx(0.2)
