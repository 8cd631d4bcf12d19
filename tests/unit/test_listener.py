"""When the shared listener says a partial transcript is due."""

from __future__ import annotations

import numpy as np

from services.common.listener import Listener
from services.common.vad import WINDOW, SileroVad, VadSettings


def feed(listener: Listener, probs: list[float]) -> None:
    audio = np.zeros(WINDOW * len(probs), dtype=np.float32)
    listener.segmenter.feed(audio, np.array(probs, dtype=np.float32))


def test_partial_due_only_while_speaking_and_after_the_interval() -> None:
    settings = VadSettings(min_speech_ms=64, min_silence_ms=640)
    listener = Listener(SileroVad(), settings, 16000)
    assert not listener.partial_due(0, 500)  # not in speech
    feed(listener, [0.9] * 20)  # 640 ms of speech
    assert listener.segmenter.in_speech
    assert listener.partial_due(0, 500)
    assert not listener.partial_due(listener.segmenter.position_ms - 100, 500)  # too soon
    assert not listener.partial_due(0, 0)  # partials off
    feed(listener, [0.05] * 3)  # trailing silence: the turn may be ending
    assert listener.segmenter.in_speech and listener.segmenter.trailing_silence_ms > 0
    assert not listener.partial_due(0, 500)
    feed(listener, [0.9] * 2)  # speaking again
    assert listener.partial_due(0, 500)
