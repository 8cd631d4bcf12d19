"""`voice-agent client --wav`: a 16-bit wav is read as it is; any other audio is decoded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile

from services.client.stream import read_audio, write_wav
from services.common.audio.pcm import encode_audio, float_to_pcm16
from services.common.errors import InvalidAudio

TONE = (0.3 * np.sin(2 * np.pi * 440 * np.arange(22050) / 22050)).astype(np.float32)  # 1 s


def test_a_pcm16_wav_keeps_its_rate(tmp_path: Path) -> None:
    path = tmp_path / "speech.wav"
    write_wav(path, float_to_pcm16(TONE), 22050)
    audio, rate = read_audio(path)
    assert rate == 22050 and audio.size == TONE.size


@pytest.mark.parametrize("kind", ["float-wav", "24-bit-wav", "flac"])
def test_other_audio_is_decoded_at_16_khz(tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"speech.{'flac' if kind == 'flac' else 'wav'}"
    if kind == "flac":
        path.write_bytes(encode_audio(TONE, 22050, "flac"))
    else:
        subtype = "FLOAT" if kind == "float-wav" else "PCM_24"
        soundfile.write(path, TONE, 22050, subtype=subtype)
    audio, rate = read_audio(path)
    assert rate == 16000 and abs(audio.size - 16000) <= 160, audio.size
    assert 0.15 < float(np.sqrt(np.mean(audio**2))) < 0.25  # the tone, not silence or noise


def test_a_file_that_is_not_audio_is_invalid_audio(tmp_path: Path) -> None:
    path = tmp_path / "notes.wav"
    path.write_text("not audio at all\n" * 100)
    with pytest.raises(InvalidAudio):
        read_audio(path)
