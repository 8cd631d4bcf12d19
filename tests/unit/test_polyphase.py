"""The streaming polyphase resampler of the full-duplex paths (services/common/audio/
polyphase.py): what a stream frame gives out at once, its accuracy, its stopband."""

from __future__ import annotations

import numpy as np
import pytest

from services.common.audio.pcm import ALLOWED_SAMPLE_RATES, StreamResampler
from services.common.audio.polyphase import PolyphaseResampler

PAIRS = [(a, b) for a in ALLOWED_SAMPLE_RATES for b in ALLOWED_SAMPLE_RATES if a != b]


def _tone(freq: float, rate: int, seconds: float, delay_s: float = 0.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate - delay_s
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def _held_back_ms(resampler: PolyphaseResampler | StreamResampler, src: int, dst: int) -> float:
    """The most of the stream's output not yet given out after a 20 ms frame, beyond the
    first ten frames."""
    given, worst = 0, 0.0
    frame = src // 50
    for i in range(100):
        given += resampler.process(np.zeros(frame, np.float32)).size
        if i >= 10:
            worst = max(worst, ((i + 1) * frame * dst / src - given) / dst * 1000)
    return worst


@pytest.mark.parametrize(("src", "dst"), PAIRS)
def test_a_frame_gives_out_all_it_determines(src: int, dst: int) -> None:
    resampler = PolyphaseResampler(src, dst)
    assert _held_back_ms(resampler, src, dst) < 1000 / dst + 1e-9  # at most one sample
    assert resampler.delay_ms <= 4.0


def test_soxr_holds_back_more_than_a_frame() -> None:
    """Why the duplex paths do not use `StreamResampler`: ~37 ms at 16 to 24 kHz."""
    assert _held_back_ms(StreamResampler(16000, 24000), 16000, 24000) > 20


@pytest.mark.parametrize(("src", "dst"), PAIRS)
def test_a_tone_comes_out_delayed_by_the_filter_alone(src: int, dst: int) -> None:
    resampler = PolyphaseResampler(src, dst)
    tone = _tone(1000, src, 0.5)
    rng = np.random.default_rng(src + dst)
    pieces, at = [], 0
    while at < tone.size:  # frames of any length, odd ones included
        size = int(rng.integers(1, src // 25))
        pieces.append(resampler.process(tone[at : at + size]))
        at += size
    out = np.concatenate(pieces)
    assert out.size == pytest.approx(tone.size * dst / src, abs=1)
    whole = PolyphaseResampler(src, dst).process(tone)
    assert np.array_equal(out, whole)  # cutting the stream changes nothing
    expected = _tone(1000, dst, out.size / dst, resampler.delay_ms / 1000)
    settled = int(0.01 * dst)  # after the filter's start-up
    assert np.abs(out[settled:] - expected[settled:]).max() < 1e-3


@pytest.mark.parametrize(("src", "dst"), [(24000, 16000), (48000, 24000), (24000, 8000)])
def test_what_the_lower_rate_cannot_carry_is_removed(src: int, dst: int) -> None:
    above = 0.55 * dst  # above the new Nyquist: it would alias
    out = PolyphaseResampler(src, dst).process(_tone(above, src, 0.5))
    rms = float(np.sqrt(np.mean(out[dst // 50 :] ** 2)))
    assert rms < 0.5 / np.sqrt(2) * 10 ** (-60 / 20)  # 60 dB down at least


def test_the_speech_band_passes_flat_between_16_and_24_khz() -> None:
    for freq in (300.0, 3000.0, 6500.0):
        out = PolyphaseResampler(16000, 24000).process(_tone(freq, 16000, 0.5))
        rms = float(np.sqrt(np.mean(out[2400:] ** 2)))
        assert rms == pytest.approx(0.5 / np.sqrt(2), rel=0.02), freq


def test_the_same_rate_is_untouched() -> None:
    audio = _tone(440, 24000, 0.1)
    assert PolyphaseResampler(24000, 24000).process(audio) is audio
