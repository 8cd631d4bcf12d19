"""Interruptible decoding: a partial's decode gives way to a final before the model runs."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from services.asr.engines.base import AsrInput, Interrupted, InterruptibleEngine
from services.asr.engines.whisper import FasterWhisperEngine
from services.asr.settings import WhisperSettings
from tests.tiny_whisper import build_tiny_whisper


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
