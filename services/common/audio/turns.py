"""Turn segmentation: speech probabilities (one per 32 ms window) + audio → turn events.

Pure and synchronous (no model here): feed it the audio a `VadStream` was given and the
probabilities it returned. Times are milliseconds from the start of the stream, derived
from a running sample counter. Hysteresis as in Silero's own segmenter: speech starts at
a probability ≥ `threshold`, silence starts below `neg_threshold`, and values in between
continue whatever is going on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from services.common.audio.vad import SAMPLE_RATE, WINDOW, Audio, VadSettings

_PER_MS = SAMPLE_RATE // 1000


@dataclass(frozen=True, slots=True)
class SpeechStart:
    """The user started speaking at `start_ms` (the detected onset, without pre-roll)."""

    start_ms: int


@dataclass(frozen=True, slots=True, eq=False)
class SpeechEnd:
    """An utterance ended (`forced`: split at the maximum length, speech may go on)."""

    start_ms: int
    end_ms: int
    audio: Audio
    """16 kHz float32: pre-roll + speech + a little trailing silence."""
    forced: bool
    audio_start_ms: int | None = None
    """Where `audio` begins on the stream's timeline (start_ms minus the pre-roll)."""

    def ends_pause(self, pause_end_ms: int) -> bool:
        """Whether this end is the pause that began at `pause_end_ms`, unchanged: a
        transcript of that pause's audio is then this utterance's final (a forced split
        may cut the audio short of the pause's). The rule for reusing a speculation."""
        return self.end_ms == pause_end_ms and not self.forced


@dataclass(frozen=True, slots=True, eq=False)
class SpeechPause:
    """The open utterance has been silent for `pause_ms` (and the trailing pad's length): the
    turn may be over. `audio` and `end_ms` are exactly what a SpeechEnd at this silence
    will carry, so work started on them now (a speculative transcript) is the turn's own
    if the user says no more. At most one per stretch of silence."""

    start_ms: int
    end_ms: int
    audio: Audio


TurnEvent = SpeechStart | SpeechPause | SpeechEnd


class _Tape:
    """Audio addressed by absolute sample position; holds [start, end) contiguously."""

    def __init__(self) -> None:
        self._buf = np.zeros(SAMPLE_RATE, dtype=np.float32)
        self._off = 0
        self.start = 0
        self.end = 0

    def append(self, samples: Audio) -> None:
        size = self.end - self.start
        if self._off + size + len(samples) > len(self._buf):
            cap = max(len(self._buf), 2 * (size + len(samples)))
            buf = np.empty(cap, dtype=np.float32) if cap > len(self._buf) else self._buf
            buf[:size] = self._buf[self._off : self._off + size]
            self._buf, self._off = buf, 0
        self._buf[self._off + size : self._off + size + len(samples)] = samples
        self.end += len(samples)

    def trim_before(self, pos: int) -> None:
        pos = min(max(pos, self.start), self.end)
        self._off += pos - self.start
        self.start = pos
        size = self.end - self.start
        if len(self._buf) > 4 * SAMPLE_RATE and size < len(self._buf) // 8:  # give memory back
            buf = np.empty(max(SAMPLE_RATE, 2 * size), dtype=np.float32)
            buf[:size] = self._buf[self._off : self._off + size]
            self._buf, self._off = buf, 0

    def view(self, a: int, b: int) -> Audio:
        a, b = max(a, self.start), max(min(b, self.end), max(a, self.start))
        out = self._buf[self._off + a - self.start : self._off + b - self.start]
        out.flags.writeable = False
        return out


class TurnSegmenter:
    """One stream's turn state machine; memory bounded by the pre-roll outside speech."""

    def __init__(self, settings: VadSettings, auto_end: bool = True) -> None:
        self.reconfigure(settings, auto_end)
        self._paused = False  # a SpeechPause went out for the current stretch of silence
        self._tape = _Tape()
        self._classified = 0  # samples covered by the probabilities fed so far
        self._floor = 0  # no utterance audio before this (last utterance end, reset point)
        self._candidate: int | None = None
        self._in_speech = False
        self._speech_start = self._audio_start = 0
        self._silence_start: int | None = None

    def reconfigure(self, settings: VadSettings, auto_end: bool = True) -> None:
        """Apply new thresholds from the next window on; the stream's clock and audio stay.

        `auto_end` False: silence never ends (nor pauses) a turn, only `flush` (a client's
        commit) or the maximum length does — push-to-talk with the VAD still marking speech.
        """
        self._thr = settings.threshold
        self._neg = settings.effective_neg_threshold
        self._min_speech = settings.min_speech_ms * _PER_MS
        self._min_silence_ms = settings.min_silence_ms
        self._pad = settings.speech_pad_ms * _PER_MS
        self._end_pad = settings.trailing_pad_ms * _PER_MS
        # a pause event needs the whole trailing pad, so its audio equals the SpeechEnd's
        self._pause_ms = max(settings.pause_ms, settings.trailing_pad_ms)
        self._max_len = int(settings.max_utterance_s * SAMPLE_RATE)
        self._auto_end = auto_end

    @property
    def in_speech(self) -> bool:
        """Whether an utterance is open (between SpeechStart and SpeechEnd)."""
        return self._in_speech

    @property
    def trailing_silence_ms(self) -> int:
        """How long the open utterance has been silent (0 while speaking or outside speech)."""
        if not self._in_speech or self._silence_start is None:
            return 0
        return (self._classified - self._silence_start) // _PER_MS

    @property
    def silence_start_ms(self) -> int | None:
        """Where the open utterance's current silence began (None while speaking)."""
        if not self._in_speech or self._silence_start is None:
            return None
        return self._silence_start // _PER_MS

    @property
    def position_ms(self) -> int:
        """How much audio the stream has heard, in ms from its start."""
        return self._tape.end // _PER_MS

    def current_audio(self) -> Audio:
        """A copy of the open utterance's audio so far (empty outside speech), for partials."""
        if not self._in_speech:
            return np.zeros(0, dtype=np.float32)
        return self._tape.view(self._audio_start, self._tape.end).copy()

    @property
    def buffered_samples(self) -> int:
        """Audio held now (pre-roll, the open utterance and samples not yet classified)."""
        return self._tape.end - self._tape.start

    def feed(self, samples_16k: npt.ArrayLike, probs: npt.ArrayLike) -> list[TurnEvent]:
        """Add audio and the probabilities of the 512-sample windows completed so far."""
        samples = np.asarray(samples_16k, dtype=np.float32)
        prob_list = np.asarray(probs, dtype=np.float32).reshape(-1).tolist()
        if samples.ndim != 1:
            raise ValueError(f"expected mono 1-D audio, got shape {samples.shape}")
        self._tape.append(samples)
        if self._classified + len(prob_list) * WINDOW > self._tape.end:
            raise ValueError("more probabilities than complete windows of audio fed")
        events: list[TurnEvent] = []
        for p in prob_list:
            s0 = self._classified
            self._classified += WINDOW
            events.extend(self._speech_step(p, s0) if self._in_speech else self._idle_step(p, s0))
        if not self._in_speech:
            onset = self._classified if self._candidate is None else self._candidate
            self._tape.trim_before(max(onset - self._pad, self._floor))
        return events

    def flush(self) -> SpeechEnd | None:
        """End the open utterance now (push-to-talk commit); None when there is none."""
        if not self._in_speech:
            self._candidate = None
            return None
        if self._silence_start is None:
            return self._end(self._tape.end, self._tape.end, forced=False)
        end = self._silence_start
        return self._end(end, min(end + self._end_pad, self._tape.end), forced=False)

    def reset(self) -> None:
        """Drop buffered audio and any open utterance (no SpeechEnd); the clock runs on."""
        self._tape.trim_before(self._tape.end)
        self._floor = self._tape.end
        self._candidate = self._silence_start = None
        self._in_speech = False

    def _idle_step(self, p: float, s0: int) -> list[TurnEvent]:
        if self._candidate is None and p >= self._thr:
            self._candidate = max(s0, self._floor)  # never before the last utterance's end
        elif self._candidate is not None and p < self._neg:
            self._candidate = None
        if self._candidate is None or s0 + WINDOW - self._candidate < self._min_speech:
            return []
        return [self._start(self._candidate, self._candidate - self._pad)]

    def _speech_step(self, p: float, s0: int) -> list[TurnEvent]:
        s1 = s0 + WINDOW
        too_long = s1 - self._audio_start > self._max_len
        if p >= self._thr:
            if too_long and self._silence_start is not None:
                return self._split_at_pause(s0, self._silence_start)
            self._silence_start = None
        elif p < self._neg and self._silence_start is None:
            self._silence_start, self._paused = s0, False
        if self._silence_start is None:  # speaking
            return [self._end(s0, s0, forced=True), self._start(s0, s0)] if too_long else []
        if not self._auto_end:
            return []
        silence_ms = (s1 - self._silence_start) // _PER_MS
        if silence_ms >= self._min_silence_ms:
            end = self._silence_start
            return [self._end(end, min(end + self._end_pad, s1), False)]
        if silence_ms >= self._pause_ms and not self._paused:
            self._paused = True
            return [self._pause(self._silence_start)]
        return []

    def _pause(self, end: int) -> SpeechPause:
        return SpeechPause(
            start_ms=self._speech_start // _PER_MS,
            end_ms=end // _PER_MS,
            audio=self._tape.view(self._audio_start, end + self._end_pad).copy(),
        )

    def _split_at_pause(self, s0: int, pause: int) -> list[TurnEvent]:
        """Speech resumes at s0 past the maximum length: cut at the pause that began there."""
        end = self._end(pause, min(pause + self._end_pad, s0), forced=True)
        return [end, self._start(s0, s0 - self._pad)]

    def _start(self, onset: int, audio_start: int) -> SpeechStart:
        self._in_speech, self._candidate, self._silence_start = True, None, None
        self._speech_start = onset
        self._audio_start = max(audio_start, self._floor, self._tape.start)
        return SpeechStart(start_ms=onset // _PER_MS)

    def _end(self, end: int, audio_end: int, forced: bool) -> SpeechEnd:
        audio_end = min(audio_end, self._audio_start + self._max_len)
        event = SpeechEnd(
            start_ms=self._speech_start // _PER_MS,
            end_ms=end // _PER_MS,
            audio=self._tape.view(self._audio_start, audio_end).copy(),
            forced=forced,
            audio_start_ms=self._audio_start // _PER_MS,
        )
        self._in_speech, self._silence_start = False, None
        self._floor = audio_end
        return event
