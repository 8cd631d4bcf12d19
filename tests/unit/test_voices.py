"""Voice-clip validation: measured levels and the reasons a clip is refused; a clips folder
that cannot be written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from services.common.audio.pcm import encode_audio
from services.common.errors import InvalidAudio
from services.tts.app import create_app
from services.tts.settings import TtsSection, TtsSettings, VoiceLibrarySettings
from services.tts.voices import analyze, decode_clip, is_library_id
from tests.conftest import RedisProc

RATE = 24000


def voice_like(seconds: float, amplitude: float = 0.3, rate: int = RATE) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    wave = sum(np.sin(2 * np.pi * f * t) / k for k, f in enumerate((140, 280, 420, 700), 1))
    envelope = 0.6 + 0.4 * np.sin(2 * np.pi * 3 * t)  # syllable-like rise and fall
    return (amplitude * envelope * wave / 2).astype(np.float32)


def wav(samples: np.ndarray, rate: int = RATE) -> bytes:
    return encode_audio(samples.astype(np.float32), rate, "wav")


def test_levels_are_measured() -> None:
    t = np.arange(RATE) / RATE
    sine = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    stats = analyze(sine, RATE)
    assert stats.duration_s == 1.0
    assert stats.rms_dbfs == pytest.approx(20 * np.log10(0.5 / np.sqrt(2)), abs=0.01)
    assert stats.peak == pytest.approx(0.5, abs=1e-3)
    assert stats.clipped_fraction == 0.0
    assert analyze(np.zeros(100, np.float32), RATE).rms_dbfs == -120.0


def test_a_good_clip_passes_and_is_resampled() -> None:
    samples, stats = decode_clip(wav(voice_like(5.0, 0.3, 16000), 16000), VoiceLibrarySettings())
    assert stats.duration_s == pytest.approx(5.0, abs=0.01)
    assert samples.size == pytest.approx(5 * RATE, abs=50)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty"),
        (b"this is not audio at all " * 40, "not audio"),
        (wav(voice_like(1.5)), "too short"),
        (wav(voice_like(31.0)), "too long"),
        (wav(np.zeros(RATE * 5, np.float32)), "silent"),
        (wav(voice_like(5.0, 0.003)), "too quiet"),
        (wav(np.clip(voice_like(5.0, 6.0), -1, 1)), "clipped"),
    ],
    ids=["empty", "not-audio", "short", "long", "silent", "quiet", "clipped"],
)
def test_bad_clips_say_what_is_wrong(data: bytes, reason: str) -> None:
    with pytest.raises(InvalidAudio, match=reason):
        decode_clip(data, VoiceLibrarySettings())


def test_too_big_is_refused_before_decoding() -> None:
    settings = VoiceLibrarySettings(max_upload_mb=0.1)
    with pytest.raises(InvalidAudio, match="exceeds 104857 bytes"):
        decode_clip(wav(voice_like(5.0)), settings)


def test_limits_are_settings() -> None:
    relaxed = VoiceLibrarySettings(min_duration_s=1.0, min_rms_dbfs=-70.0)
    decode_clip(wav(voice_like(1.5, 0.003)), relaxed)
    with pytest.raises(ValueError, match="min_duration_s"):
        VoiceLibrarySettings(min_duration_s=10.0, max_duration_s=5.0)


def test_library_ids() -> None:
    assert is_library_id("v_0123456789abcdef")
    for other in (None, "default", "en-us+klatt2", "v_0123", "v_0123456789ABCDEF", "../v_x"):
        assert not is_library_id(other)


def test_an_unwritable_voices_dir_is_a_typed_503_naming_the_setting(
    redis_server: RedisProc, tmp_path: Path
) -> None:
    """A read-only install (systemd's ProtectSystem=strict, compose's read_only) cannot keep
    clips: the upload says which setting to change, and leaves no voice behind."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    section = TtsSection(voices=VoiceLibrarySettings(dir=blocker / "voices"))
    settings = TtsSettings(profile="fake", redis=redis_server.settings(), tts=section)
    with TestClient(create_app(settings)) as client:
        files = {"file": ("me.wav", wav(voice_like(5.0)), "audio/wav")}
        refused = client.post("/v1/voices", files=files, data={"name": "me"})
        assert refused.status_code == 503, refused.text
        message = refused.json()["error"]["message"]
        assert "VA_TTS__VOICES__DIR" in message and str(blocker / "voices") in message
        assert "internal error" not in message
        listed = client.get("/v1/voices").json()["voices"]
        assert [v for v in listed if v["source"] == "library"] == []
