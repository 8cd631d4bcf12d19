"""`VA_PROFILE`: `dual-gpu` picks the GPU engines, `fake` the fake ones; explicit settings win."""

from __future__ import annotations

import pytest

from services.asr.engines import create_engine as create_asr_engine
from services.asr.engines.fake import FakeAsrEngine
from services.asr.settings import AsrSection, AsrSettings
from services.common.service.profiles import with_defaults
from services.tts.engines import create_engine as create_tts_engine
from services.tts.engines.fake import FakeTtsEngine
from services.tts.settings import TtsSection, TtsSettings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("VA_"):
            monkeypatch.delenv(name)


def test_lite_is_the_default() -> None:
    asr = AsrSettings().asr
    assert (asr.engine, asr.whisper.model, asr.whisper.device) == (
        "faster-whisper",
        "tiny.en",
        "cpu",
    )
    assert (TtsSettings().tts.engine, TtsSettings().tts.piper.default_voice) == ("piper", "joe")


def test_dual_gpu_picks_faster_whisper_on_gpu_0_and_chatterbox_on_gpu_1() -> None:
    asr = AsrSettings(profile="dual-gpu").asr
    tts = TtsSettings(profile="dual-gpu").tts
    assert (asr.engine, asr.whisper.device, asr.whisper.gpu) == ("faster-whisper", "cuda", 0)
    assert asr.whisper.model == "large-v3-turbo"
    assert (tts.engine, tts.chatterbox.device, tts.chatterbox.gpu) == ("chatterbox", "cuda", 1)
    assert tts.chatterbox.compile_mode == "reduce-overhead"  # CUDA graphs: measured faster


def test_dual_gpu_chatterbox_can_be_told_to_run_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VA_PROFILE", "dual-gpu")
    monkeypatch.setenv("VA_TTS__CHATTERBOX__COMPILE_MODE", "off")
    assert TtsSettings().tts.chatterbox.compile_mode == "off"
    assert TtsSection().chatterbox.compile_mode == "off"  # and it is not the shared default


def test_dual_gpu_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VA_PROFILE", "dual-gpu")
    assert AsrSettings().asr.engine == "faster-whisper"
    assert TtsSettings().tts.engine == "chatterbox"


def test_an_explicit_engine_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VA_PROFILE", "dual-gpu")
    monkeypatch.setenv("VA_ASR__ENGINE", "fake")
    monkeypatch.setenv("VA_TTS__ENGINE", "piper")
    asr, tts = AsrSettings().asr, TtsSettings().tts
    assert (asr.engine, asr.whisper.device, asr.whisper.gpu) == ("fake", "cpu", None)
    assert (tts.engine, tts.chatterbox.gpu) == ("piper", None)


def test_an_explicit_model_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VA_PROFILE", "dual-gpu")
    monkeypatch.setenv("VA_ASR__WHISPER__MODEL", "tiny.en")
    asr = AsrSettings().asr
    assert (asr.whisper.model, asr.whisper.device, asr.whisper.gpu) == ("tiny.en", "cuda", 0)


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
    asr = AsrSettings(profile="dual-gpu", asr=AsrSection(engine="fake", max_batch=4)).asr
    assert (asr.engine, asr.max_batch) == ("fake", 4)
    tts = TtsSettings(profile="dual-gpu", tts=TtsSection(max_concurrent=8)).tts
    assert (tts.engine, tts.max_concurrent) == ("chatterbox", 8)


def test_profiles_never_change_the_shared_defaults() -> None:
    AsrSettings(profile="dual-gpu")
    TtsSettings(profile="dual-gpu")
    assert AsrSettings().asr.whisper.model == "tiny.en"
    assert AsrSection().whisper.gpu is None
    assert TtsSection().engine == "piper"


def test_with_defaults_fills_only_unset_fields() -> None:
    section = AsrSection(max_batch=4)
    filled = with_defaults(section, {"max_batch": 32, "max_queue": 7, "whisper": {"beam_size": 2}})
    assert (filled.max_batch, filled.max_queue, filled.whisper.beam_size) == (4, 7, 2)
    assert with_defaults(section, {}) is section


def test_fake_profile_picks_both_fake_engines() -> None:
    assert AsrSettings(profile="fake").asr.engine == "fake"
    assert TtsSettings(profile="fake").tts.engine == "fake"


def test_fake_profile_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VA_PROFILE", "fake")
    monkeypatch.setenv("VA_ASR__FAKE__TEXT", "good morning")
    monkeypatch.setenv("VA_ASR__FAKE__LATENCY_MS", "25")
    monkeypatch.setenv("VA_TTS__FAKE__MS_PER_WORD", "150")
    asr, tts_section = AsrSettings().asr, TtsSettings().tts
    assert (asr.engine, asr.fake.text, asr.fake.latency_ms) == ("fake", "good morning", 25)
    assert (tts_section.engine, tts_section.fake.ms_per_word) == ("fake", 150)
    assert isinstance(create_asr_engine(asr), FakeAsrEngine)
    assert isinstance(create_tts_engine(tts_section), FakeTtsEngine)


def test_an_explicit_engine_beats_the_fake_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VA_PROFILE", "fake")
    monkeypatch.setenv("VA_ASR__ENGINE", "faster-whisper")
    assert AsrSettings().asr.engine == "faster-whisper"
    assert TtsSettings().tts.engine == "fake"
    assert TtsSettings(tts=TtsSection(engine="espeak")).tts.engine == "espeak"


def test_fake_engines_are_chosen_by_name_under_any_profile() -> None:
    assert AsrSettings(asr=AsrSection(engine="fake")).asr.engine == "fake"
    assert AsrSettings().asr.engine == "faster-whisper"  # the profile changed no default
    assert TtsSettings(profile="dual-gpu", tts=TtsSection(engine="fake")).tts.engine == "fake"


def test_the_duplex_profile_puts_the_gateway_in_front_of_the_duplex_service(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from services.gateway.settings import GatewaySection, GatewaySettings

    assert GatewaySettings().gateway.backend == "cascade"
    assert GatewaySettings(profile="fake").gateway.backend == "cascade"
    assert GatewaySettings(profile="duplex").gateway.backend == "duplex"
    explicit = GatewaySettings(profile="duplex", gateway=GatewaySection(backend="cascade"))
    assert explicit.gateway.backend == "cascade"
    monkeypatch.setenv("VA_PROFILE", "duplex")
    monkeypatch.setenv("VA_GATEWAY__DUPLEX_URL", "wss://duplex.internal:8443/base")
    section = GatewaySettings().gateway
    assert (section.backend, section.duplex_url) == ("duplex", "wss://duplex.internal:8443/base")
    monkeypatch.setenv("VA_GATEWAY__DUPLEX_URL", "http://duplex:8003")
    with pytest.raises(ValueError, match="duplex_url"):
        GatewaySettings()
