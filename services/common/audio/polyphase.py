"""A streaming resampler whose latency is its filter's and nothing more.

soxr's stream resampler (`pcm.StreamResampler`) is excellent offline but hands out its
output in blocks: between 16 and 24 kHz, fed 20 ms at a time, it holds back up to ~37 ms
of the stream (up to ~75 ms from 8 kHz), whatever its quality setting. Where the audio is
a conversation with a model that hears and speaks in 80 ms frames (full duplex), that is
latency added to every frame. This one is a polyphase FIR (a Kaiser-windowed sinc, ~70 dB
stopband from the lower rate's Nyquist, flat to ~86% of it: 6.9 kHz between 16 and 24 kHz,
-6 dB at 93%): each input frame gives every
output sample it determines, at once, so the only delay is the filter's group delay
(1-3 ms for the wire's rates; `delay_ms`). Between the wire's rates (8, 16, 24, 48 kHz)
the ratios are small (at most 6:1), so the filter is short and a frame costs microseconds.
"""

from __future__ import annotations

from math import gcd

import numpy as np
import numpy.typing as npt

from services.common.audio.pcm import AudioF32

TAPS_PER_RATIO = 64
"""Filter length, in samples at the common (upsampled) rate, per unit of max(up, down)."""
ATTENUATION_DB = 70.0
"""Stopband attenuation: aliases of the user's voice stay 70 dB down."""


def windowed_sinc(cutoff: float, window: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """A linear-phase low-pass FIR: the ideal filter at `cutoff` (a fraction of the sample
    rate) shaped by `window`, centred; as long as the window."""
    n = np.arange(window.size) - (window.size - 1) / 2
    taps: npt.NDArray[np.float64] = 2 * cutoff * np.sinc(2 * cutoff * n) * window
    return taps


def _phases(up: int, down: int) -> npt.NDArray[np.float32]:
    """The filter split into its `up` phases, each ordered for a window of input samples
    (oldest first): row p holds the taps applied to output samples of phase p."""
    length = TAPS_PER_RATIO * max(up, down)
    length += -length % up  # whole phases
    beta = 0.1102 * (ATTENUATION_DB - 8.7)  # Kaiser's formulas for a windowed sinc
    transition = (ATTENUATION_DB - 7.95) / (14.36 * (length - 1))  # of the common rate
    cutoff = 0.5 / max(up, down) - transition / 2  # stopband from the lower Nyquist
    taps = windowed_sinc(cutoff, np.kaiser(length, beta)) * up
    per_phase = length // up
    # output phase p weighs x[i - k] by taps[p + k * up]; a window x[i-K+1 .. i] is oldest first
    index = np.arange(up)[:, None] + (per_phase - 1 - np.arange(per_phase))[None, :] * up
    phases: npt.NDArray[np.float32] = taps[index].astype(np.float32)
    return phases


class PolyphaseResampler:
    """Resamples a stream frame by frame, as `StreamResampler` does, with no held-back
    output beyond the filter's group delay."""

    def __init__(self, src_rate: int, dst_rate: int) -> None:
        self.src_rate = src_rate
        self.dst_rate = dst_rate
        common = gcd(src_rate, dst_rate)
        self.up, self.down = dst_rate // common, src_rate // common
        self._phases = _phases(self.up, self.down) if self.up != self.down else None
        width = 0 if self._phases is None else self._phases.shape[1]
        self._window = width
        self._buffer = np.zeros(max(width - 1, 0), np.float32)
        self._first = -(width - 1)  # stream index of _buffer[0] (zeros before the start)
        self._received = 0  # input samples so far
        self._produced = 0  # output samples so far

    @property
    def delay_ms(self) -> float:
        """The filter's group delay: how far the output lags the input."""
        if self._phases is None:
            return 0.0
        length = self._phases.size
        return (length - 1) / 2 / (self.src_rate * self.up) * 1000

    def process(self, audio: AudioF32) -> AudioF32:
        """Every output sample the stream so far determines."""
        phases = self._phases
        if phases is None:
            return audio
        self._buffer = np.concatenate([self._buffer, audio.astype(np.float32, copy=False)])
        self._received += audio.size
        # output n needs input floor(n * down / up): every n whose input has arrived
        start = self._produced
        end = (self._received * self.up + self.down - 1) // self.down
        out = np.empty(max(end - start, 0), np.float32)
        width = self._window
        for r in range(self.up):  # outputs b * up + r: one phase, windows `down` apart
            first_b = -(-(start - r) // self.up)
            last_b = -(-(end - r) // self.up) - 1
            if last_b < first_b:
                continue
            lag = r * self.down
            newest = first_b * self.down + lag // self.up
            at = newest - (width - 1) - self._first
            span = (last_b - first_b) * self.down + width
            values = np.correlate(self._buffer[at : at + span], phases[lag % self.up], "valid")
            out[first_b * self.up + r - start :: self.up] = values[:: self.down]
        self._produced = end
        self._keep_from(end * self.down // self.up - (width - 1))
        return out

    def _keep_from(self, first: int) -> None:
        """Drop input no later output needs (the next one's window starts at `first`)."""
        drop = min(max(first - self._first, 0), self._buffer.size)
        self._buffer = self._buffer[drop:]
        self._first += drop
