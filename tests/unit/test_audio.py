"""PCM16 framing, resampling, decoding uploads and encoding replies."""

from __future__ import annotations

import numpy as np
import pytest

from services.common.audio import pcm as audio
from services.common.errors import InvalidAudio, UnsupportedSampleRate


def tone(rate: int, seconds: float = 1.0, freq: float = 440.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def test_pcm16_round_trip_and_clipping() -> None:
    x = np.array([0.0, 0.5, -0.5, 1.5, -1.5], dtype=np.float32)
    y = audio.pcm16_to_float(audio.float_to_pcm16(x))
    assert np.allclose(y[:3], x[:3], atol=1 / 32768)
    assert y[3] == pytest.approx(32767 / 32768) and y[4] == -1.0


def test_odd_length_pcm_is_invalid_audio() -> None:
    with pytest.raises(InvalidAudio, match="even number of bytes"):
        audio.pcm16_to_float(b"\x00\x01\x02")


@pytest.mark.parametrize("rate", [8000, 16000, 24000, 48000])
def test_allowed_rates(rate: int) -> None:
    assert audio.check_sample_rate(rate) == rate


@pytest.mark.parametrize("rate", [0, 11025, 22050, 44100, 96000])
def test_other_rates_are_refused(rate: int) -> None:
    with pytest.raises(UnsupportedSampleRate):
        audio.check_sample_rate(rate)


def test_stream_resampler_equals_whole_signal_resampling() -> None:
    x = tone(48000, 1.0)
    stream = audio.StreamResampler(48000, 16000)
    parts = [stream.process(x[i : i + 960]) for i in range(0, x.size, 960)]
    parts.append(stream.process(np.zeros(0, np.float32), last=True))
    streamed = np.concatenate(parts)
    whole = audio.resample(x, 48000, 16000)
    assert abs(streamed.size - whole.size) <= 1
    n = min(streamed.size, whole.size)
    # frame-wise resampling has no clicks at frame joins: equal to the whole-signal result
    assert np.max(np.abs(streamed[200 : n - 200] - whole[200 : n - 200])) < 1e-3


def test_resample_preserves_a_tone() -> None:
    y = audio.resample(tone(24000, 1.0, 440.0), 24000, 16000)
    spectrum = np.abs(np.fft.rfft(y))
    assert np.argmax(spectrum) * 16000 / y.size == pytest.approx(440.0, abs=2)


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "opus", "aac"])
def test_encode_then_decode(fmt: str) -> None:
    x = tone(24000, 1.0)
    data = audio.encode_audio(x, 24000, fmt)
    y = audio.decode_file(data, 16000)
    assert y.size == pytest.approx(16000, rel=0.1)
    assert float(np.sqrt(np.mean(y**2))) == pytest.approx(0.5 / np.sqrt(2), rel=0.15)


@pytest.mark.parametrize("fmt", ["pcm", "wav", "flac", "mp3", "opus", "aac"])
def test_no_samples_encode_to_an_empty_file(fmt: str) -> None:
    """A text that sounds like nothing is an empty reply, not a failed encoder."""
    data = audio.encode_audio(np.zeros(0, np.float32), 24000, fmt)
    magic = {"wav": b"RIFF", "flac": b"fLaC", "mp3": b"ID3", "opus": b"OggS"}.get(fmt, b"")
    assert data.startswith(magic) and (data == b"") == (magic == b"")


def test_pcm_encoding_is_raw() -> None:
    x = tone(16000, 0.1)
    assert audio.encode_audio(x, 16000, "pcm") == audio.float_to_pcm16(x)
    assert audio.media_type("pcm") == "audio/pcm"
    assert audio.media_type("mp3") == "audio/mpeg"


@pytest.mark.parametrize("data", [b"", b"not audio at all" * 100, b"RIFF\x00\x00\x00\x00WAVEjunk"])
def test_undecodable_uploads_are_invalid_audio(data: bytes) -> None:
    with pytest.raises(InvalidAudio):
        audio.decode_file(data, 16000)


def test_decoding_stops_past_the_longest_file() -> None:
    """A small file of a low bitrate can hold hours: decoding stops at `max_seconds`."""
    data = audio.encode_audio(np.zeros(8000 * 60, np.float32), 8000, "flac")  # a minute
    assert len(data) < 20_000
    assert audio.decode_file(data, 16000, max_seconds=61).size == 16000 * 60
    with pytest.raises(InvalidAudio, match="more than 10 s of audio"):
        audio.decode_file(data, 16000, max_seconds=10)


def test_ms_sample_conversions() -> None:
    assert audio.ms_to_samples(20, 16000) == 320
    assert audio.samples_to_ms(24000, 24000) == 1000


def test_speech_ends_after_the_last_loud_sample() -> None:
    """What the stream client's voice-to-voice counts from, and where Piper trims a tail."""

    def trailing_silence_s(samples: np.ndarray, rate: int) -> float:
        return (samples.size - audio.speech_end(samples)) / rate

    speech = np.full(8000, 0.2, np.float32)
    hiss = np.full(4000, 0.005, np.float32)  # -46 dBFS: quiet enough to be silence
    clip = np.concatenate([np.zeros(1600, np.float32), speech, hiss, np.zeros(12_000, np.float32)])
    assert trailing_silence_s(clip, 16000) == pytest.approx(1.0)
    assert trailing_silence_s(speech, 16000) == 0.0
    assert trailing_silence_s(np.zeros(3200, np.float32), 16000) == pytest.approx(0.2)
