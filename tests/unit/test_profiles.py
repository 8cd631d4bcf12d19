"""`VA_PROFILE=dual-gpu`: one setting picks the GPU engines; explicit settings still win."""

from __future__ import annotations

import pytest

from services.asr.settings import AsrSection, AsrSettings
from services.common.profiles import with_defaults
from services.tts.settings import TtsSection, TtsSettings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("VA_"):
            monkeypatch.delenv(name)


def test_lite_is_the_default() -> None:
    assert AsrSettings().asr.engine == "sphinx"
    assert TtsSettings().tts.engine == "espeak"


def test_dual_gpu_picks_faster_whisper_on_gpu_0_and_chatterbox_on_gpu_1() -> None:
    asr = AsrSettings(profile="dual-gpu").asr
    tts = TtsSettings(profile="dual-gpu").tts
    assert (asr.engine, asr.whisper.device, asr.whisper.gpu) == ("faster-whisper", "cuda", 0)
    assert (tts.engine, tts.chatterbox.device, tts.chatterbox.gpu) == ("chatterbox", "cuda", 1)


def test_dual_gpu_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VA_PROFILE", "dual-gpu")
    assert AsrSettings().asr.engine == "faster-whisper"
    assert TtsSettings().tts.engine == "chatterbox"


def test_an_explicit_engine_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VA_PROFILE", "dual-gpu")
    monkeypatch.setenv("VA_ASR__ENGINE", "sphinx")
    monkeypatch.setenv("VA_TTS__ENGINE", "espeak")
    asr, tts = AsrSettings().asr, TtsSettings().tts
    assert (asr.engine, asr.whisper.device, asr.whisper.gpu) == ("sphinx", "auto", None)
    assert (tts.engine, tts.chatterbox.gpu) == ("espeak", None)


def test_explicit_device_settings_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VA_PROFILE", "dual-gpu")
    monkeypatch.setenv("VA_ASR__WHISPER__DEVICE", "cpu")
    monkeypatch.setenv("VA_TTS__CHATTERBOX__DEVICE_INDEX", "0")
    monkeypatch.setenv("VA_TTS__CHATTERBOX__MODEL", "/srv/models/chatterbox")
    asr, tts = AsrSettings().asr, TtsSettings().tts
    assert (asr.engine, asr.whisper.device, asr.whisper.gpu) == ("faster-whisper", "cpu", 0)
    assert (tts.chatterbox.device, tts.chatterbox.gpu, tts.chatterbox.device_index) == (
        "cuda",
        None,
        0,
    )
    assert tts.chatterbox.model == "/srv/models/chatterbox"


def test_settings_passed_in_code_win_too() -> None:
    asr = AsrSettings(profile="dual-gpu", asr=AsrSection(engine="sphinx", max_batch=4)).asr
    assert (asr.engine, asr.max_batch) == ("sphinx", 4)
    tts = TtsSettings(profile="dual-gpu", tts=TtsSection(max_concurrent=8)).tts
    assert (tts.engine, tts.max_concurrent) == ("chatterbox", 8)


def test_profiles_never_change_the_shared_defaults() -> None:
    AsrSettings(profile="dual-gpu")
    TtsSettings(profile="dual-gpu")
    assert AsrSettings().asr.engine == "sphinx"
    assert AsrSection().whisper.gpu is None
    assert TtsSection().engine == "espeak"


def test_with_defaults_fills_only_unset_fields() -> None:
    section = AsrSection(max_batch=4)
    filled = with_defaults(section, {"max_batch": 32, "max_queue": 7, "whisper": {"beam_size": 2}})
    assert (filled.max_batch, filled.max_queue, filled.whisper.beam_size) == (4, 7, 2)
    assert with_defaults(section, {}) is section
