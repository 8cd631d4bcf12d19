"""Interruptible decoding: a partial's decode gives way to a final within one slice."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from services.asr.engines.base import AsrInput, Interrupted, InterruptibleEngine
from services.asr.engines.sphinx import SphinxEngine
from services.asr.engines.whisper import FasterWhisperEngine
from services.asr.settings import SphinxSettings, WhisperSettings
from tests.speech import speak
from tests.tiny_whisper import build_tiny_whisper

SENTENCE = "the weather is nice today"


@pytest.fixture(scope="module")
def sphinx() -> SphinxEngine:
    engine = SphinxEngine(SphinxSettings())
    engine.load()
    return engine


def test_sliced_decoding_hears_what_whole_decoding_hears(sphinx: SphinxEngine) -> None:
    assert isinstance(sphinx, InterruptibleEngine)
    audio = AsrInput(speak(SENTENCE))
    whole = sphinx.transcribe_batch([audio])[0].text.split()
    sliced = sphinx.transcribe_batch_until([audio], threading.Event())[0].text.split()
    assert len(set(sliced) & set(SENTENCE.split())) >= len(set(whole) & set(SENTENCE.split())) - 1


def test_a_stopped_decode_gives_up_within_a_slice(sphinx: SphinxEngine) -> None:
    long = AsrInput(np.tile(speak(SENTENCE), 4))  # ~8 s: roughly 1.5 s of decoding here
    stop = threading.Event()
    threading.Timer(0.1, stop.set).start()
    started = time.perf_counter()
    with pytest.raises(Interrupted):
        sphinx.transcribe_batch_until([long, long], stop)
    assert time.perf_counter() - started < 0.6
    # the decoder is left clean for the next call
    assert sphinx.transcribe_batch([AsrInput(speak(SENTENCE))])[0].text


def test_whisper_checks_its_stop_before_the_model_runs(tmp_path: Path) -> None:
    model_dir = build_tiny_whisper(tmp_path / "tiny")
    engine = FasterWhisperEngine(WhisperSettings(model=str(model_dir), device="cpu"))
    engine.load()
    assert isinstance(engine, InterruptibleEngine)
    stop = threading.Event()
    audio = AsrInput(np.zeros(16000, dtype=np.float32), "en")
    assert len(engine.transcribe_batch_until([audio], stop)) == 1
    stop.set()
    with pytest.raises(Interrupted):
        engine.transcribe_batch_until([audio], stop)
