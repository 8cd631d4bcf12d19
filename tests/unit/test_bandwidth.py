"""Telephone-band speech's top octave folded above 4 kHz before Whisper hears it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from services.common.audio.bandwidth import fold_phone_band, needs_fold
from services.common.audio.pcm import resample

RATE = 16000


def _tone(freq: float, seconds: float = 1.0) -> np.ndarray[Any, np.dtype[np.float32]]:
    t = np.arange(int(RATE * seconds)) / RATE
    return (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def _level(audio: np.ndarray[Any, Any], low: float, high: float) -> float:
    """The peak magnitude of `audio`'s spectrum between `low` and `high` Hz (edges trimmed,
    Hann window), relative to a full-scale sine's."""
    core = audio[len(audio) // 8 : -len(audio) // 8]
    spectrum = np.abs(np.fft.rfft(core * np.hanning(core.size))) / (core.size / 4)
    freqs = np.fft.rfftfreq(core.size, 1 / RATE)
    return float(spectrum[(freqs >= low) & (freqs <= high)].max())


def test_a_tone_in_the_top_octave_is_mirrored_about_4_khz_at_the_gain() -> None:
    folded = fold_phone_band(_tone(3000), RATE, gain=0.5)
    assert _level(folded, 2950, 3050) == pytest.approx(0.3, rel=0.05)  # kept as it was
    assert _level(folded, 4950, 5050) == pytest.approx(0.15, rel=0.05)  # 8000 - 3000
    assert _level(folded, 6100, 8000) < 1e-3


def test_the_lower_band_is_not_mirrored() -> None:
    """Vowels' formants (below 2 kHz) would land at 6-8 kHz: they are left out."""
    folded = fold_phone_band(_tone(700), RATE, gain=0.5)
    assert _level(folded, 650, 750) == pytest.approx(0.3, rel=0.05)
    assert _level(folded, 4000, 8000) < 3e-3


def test_phone_noise_gains_energy_above_4_khz_and_none_above_6() -> None:
    rng = np.random.default_rng(3)
    noise = (rng.standard_normal(4 * RATE) * 0.1).astype(np.float32)
    phone = resample(resample(noise, RATE, 8000), 8000, RATE)
    folded = fold_phone_band(phone, RATE)
    assert folded.dtype == np.float32 and folded.size == phone.size
    assert _level(phone, 4300, 5700) < 0.1 * _level(folded, 4300, 5700)
    assert _level(folded, 6500, 8000) < 0.05 * _level(folded, 4300, 5700)


def test_off_empty_or_another_rate_is_left_as_it_is() -> None:
    audio = _tone(3000)
    assert fold_phone_band(audio, RATE, gain=0.0) is audio
    assert fold_phone_band(audio, 24000) is audio
    empty = np.zeros(0, np.float32)
    assert fold_phone_band(empty, RATE).size == 0


def test_any_length_keeps_its_length_even_shorter_than_the_filter() -> None:
    """A 30-sample 8 kHz upload decodes to ~60 samples at 16 kHz: shorter than the
    101-tap filter, it must not fail (nor fail the batch it is in)."""
    rng = np.random.default_rng(5)
    for size in (1, 2, 50, 100, 101, 102, 200, 1601):
        audio = (rng.standard_normal(size) * 0.1).astype(np.float32)
        folded = fold_phone_band(audio, RATE)
        assert folded.shape == audio.shape and folded.dtype == np.float32


def test_the_filter_is_centred_the_fold_adds_no_delay() -> None:
    """A click stays where it was; its folded part is centred on it."""
    click = np.zeros(1001, np.float32)
    click[500] = 1.0
    folded = fold_phone_band(click, RATE)
    assert int(np.argmax(np.abs(folded))) == 500
    added = np.abs(folded - click)
    assert added[:450].max() < 1e-6 and added[551:].max() < 1e-6


@pytest.mark.parametrize(
    ("source_rate", "folded"),
    [(8000, True), (6000, True), (None, False), (0, False), (11025, False), (16000, False)],
)
def test_only_speech_captured_at_8_khz_or_below_is_folded(
    source_rate: int | None, folded: bool
) -> None:
    assert needs_fold(source_rate) is folded
