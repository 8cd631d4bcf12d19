"""VAD: the turn segmenter on scripted probabilities, and Silero VAD v6 on real audio."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from services.common.audio.turns import (
    SpeechEnd,
    SpeechPause,
    SpeechStart,
    TurnEvent,
    TurnSegmenter,
)
from services.common.audio.vad import WINDOW, SileroVad, VadSettings
from services.common.errors import EngineUnavailable
from tests.speech import speak

Audio = npt.NDArray[np.float32]
FRAME = 320  # 20 ms at 16 kHz
MS = 16  # samples per millisecond


class ScriptedVad:
    """Stands in for a VadStream: returns scripted probabilities, one per full window."""

    def __init__(self, probs: Sequence[float]) -> None:
        self._probs = list(probs)
        self._samples = 0
        self._done = 0

    def push(self, samples: Audio) -> list[float]:
        self._samples += len(samples)
        ready = min(self._samples // WINDOW, len(self._probs))
        out, self._done = self._probs[self._done : ready], ready
        return out


def classic(**overrides: Any) -> VadSettings:
    """The pads and pause these tests count in (the defaults keep 100 ms after speech)."""
    return VadSettings(pause_ms=200, speech_pad_ms=200, trailing_pad_ms=200, **overrides)


def ramp(start: int, end: int) -> Audio:
    """Audio whose every sample holds its own position: slices show where they came from."""
    return np.arange(start, end, dtype=np.float32)


def drive(
    seg: TurnSegmenter,
    probs: Sequence[float],
    frame: int = FRAME,
    start: int = 0,
    pauses: bool = False,
) -> list[tuple[int, TurnEvent]]:
    """Feed len(probs) windows of ramp audio in `frame`-sized pieces; events with the
    number of samples fed when each appeared (SpeechPause only with `pauses`)."""
    vad = ScriptedVad(probs)
    events: list[tuple[int, TurnEvent]] = []
    total = len(probs) * WINDOW
    for pos in range(0, total, frame):
        chunk = ramp(start + pos, start + min(pos + frame, total))
        events += [(pos + len(chunk), e) for e in seg.feed(chunk, vad.push(chunk))]
    return [(fed, e) for fed, e in events if pauses or not isinstance(e, SpeechPause)]


def decided_in_window(fed: int) -> int:
    """The window whose probability led to an event seen after `fed` samples (FRAME steps)."""
    window = fed // WINDOW - 1
    assert fed - FRAME < (window + 1) * WINDOW <= fed
    return window


def kinds(events: Sequence[tuple[int, TurnEvent]]) -> list[str]:
    return [type(e).__name__ for _, e in events]


def check_audio(end: SpeechEnd, first: int, stop: int) -> None:
    """The utterance audio is exactly samples [first, stop) of the stream."""
    assert end.audio.dtype == np.float32
    np.testing.assert_array_equal(end.audio, ramp(first, stop))


# ---- the segmenter (no model) ----


def test_start_after_min_speech_with_exact_time() -> None:
    seg = TurnSegmenter(classic())
    events = drive(seg, [0.0] * 20 + [0.9] * 20)
    assert kinds(events) == ["SpeechStart"]
    fed, start = events[0]
    assert start == SpeechStart(start_ms=20 * 32)
    # 250 ms = 4000 samples is reached inside the 8th speech window (8 x 512 = 4096)
    assert decided_in_window(fed) == 20 + 7
    assert seg.in_speech


def test_short_blip_is_ignored() -> None:
    seg = TurnSegmenter(classic())
    assert drive(seg, [0.0] * 10 + [0.95] * 3 + [0.0] * 30 + [0.9] * 6 + [0.0] * 10) == []
    assert not seg.in_speech


def test_end_after_min_silence_with_preroll_and_trailing_pad() -> None:
    seg = TurnSegmenter(classic())
    events = drive(seg, [0.0] * 10 + [0.9] * 30 + [0.0] * 30)
    assert kinds(events) == ["SpeechStart", "SpeechEnd"]
    fed, end = events[1]
    assert isinstance(end, SpeechEnd)
    assert (end.start_ms, end.end_ms, end.forced) == (320, 40 * 32, False)
    assert end.audio_start_ms == 320 - 200
    # 600 ms of silence = 19 windows (608 ms) after the speech ended at window 40
    assert decided_in_window(fed) == 40 + 18
    check_audio(end, 120 * MS, (1280 + 200) * MS)
    assert not seg.in_speech


def test_hysteresis_between_thresholds() -> None:
    seg = TurnSegmenter(classic(threshold=0.5, neg_threshold=0.3))
    # 0.4 keeps speech going (no silence starts), 0.2 starts the silence count
    events = drive(seg, [0.9] * 10 + [0.4] * 40 + [0.2] * 25)
    assert kinds(events) == ["SpeechStart", "SpeechEnd"]
    end = events[1][1]
    assert isinstance(end, SpeechEnd)
    assert end.end_ms == 50 * 32


def test_preroll_is_bounded_and_clamped_at_stream_start() -> None:
    settings = classic()
    seg = TurnSegmenter(settings)
    drive(seg, [0.0] * 400)  # 12.8 s of silence
    bound = (settings.speech_pad_ms + settings.min_speech_ms) * MS + WINDOW + FRAME
    assert seg.buffered_samples <= bound
    assert seg.buffered_samples >= settings.speech_pad_ms * MS

    seg = TurnSegmenter(settings)
    events = drive(seg, [0.9] * 20 + [0.0] * 20)
    end = events[1][1]
    assert isinstance(end, SpeechEnd)
    assert end.audio_start_ms == 0
    check_audio(end, 0, (640 + 200) * MS)


def test_force_split_at_max_length_continues_as_new_utterance() -> None:
    seg = TurnSegmenter(classic(max_utterance_s=1.0))
    events = drive(seg, [0.0] * 10 + [0.9] * 100 + [0.0] * 25)
    assert kinds(events) == ["SpeechStart"] + ["SpeechEnd", "SpeechStart"] * 3 + ["SpeechEnd"]
    ends = [e for _, e in events if isinstance(e, SpeechEnd)]
    starts = [e for _, e in events if isinstance(e, SpeechStart)]
    assert [e.forced for e in ends] == [True, True, True, False]
    assert all(len(e.audio) <= 16_000 for e in ends)
    # back to back: each piece starts where the last one was cut, nothing lost or repeated
    audio = np.concatenate([e.audio for e in ends])
    check_audio(SpeechEnd(0, 0, audio, False), (320 - 200) * MS, (110 * 32 + 200) * MS)
    for cut, nxt in zip(ends[:-1], starts[1:], strict=True):
        assert nxt.start_ms == cut.end_ms
    assert ends[-1].end_ms == 110 * 32


def test_force_split_prefers_a_pause() -> None:
    seg = TurnSegmenter(classic(max_utterance_s=1.0))
    # 800 ms of speech, a 320 ms pause (too short to end the turn), speech again
    events = drive(seg, [0.9] * 25 + [0.0] * 10 + [0.9] * 10 + [0.0] * 25)
    assert kinds(events) == ["SpeechStart", "SpeechEnd", "SpeechStart", "SpeechEnd"]
    first, second = events[1][1], events[3][1]
    assert isinstance(first, SpeechEnd) and isinstance(second, SpeechEnd)
    assert (first.start_ms, first.end_ms, first.forced) == (0, 800, True)
    check_audio(first, 0, 16_000)  # trailing pad cut at the maximum length
    assert events[2][1] == SpeechStart(start_ms=35 * 32)
    assert (second.start_ms, second.end_ms, second.forced) == (1120, 1440, False)
    check_audio(second, 16_000, (1440 + 200) * MS)  # its pre-roll stops where the first ended


def test_flush_ends_utterance_now() -> None:
    seg = TurnSegmenter(classic())
    assert seg.flush() is None
    drive(seg, [0.0] * 10 + [0.9] * 20)
    tail = ramp(30 * WINDOW, 30 * WINDOW + 100)  # not yet a full window
    assert seg.feed(tail, []) == []
    end = seg.flush()
    assert end is not None and not end.forced
    assert (end.start_ms, end.end_ms) == (320, (30 * WINDOW + 100) // MS)
    check_audio(end, 120 * MS, 30 * WINDOW + 100)
    assert not seg.in_speech
    assert seg.flush() is None


def test_reset_drops_audio_and_the_open_utterance() -> None:
    seg = TurnSegmenter(classic())
    drive(seg, [0.9] * 20)
    assert seg.in_speech
    seg.reset()
    assert not seg.in_speech and seg.buffered_samples == 0
    # the clock runs on: new speech right after the reset, pre-roll stops at the reset
    events = drive(seg, [0.9] * 10 + [0.0] * 20, start=20 * WINDOW)
    assert kinds(events) == ["SpeechStart", "SpeechEnd"]
    end = events[1][1]
    assert isinstance(end, SpeechEnd)
    assert end.start_ms == 20 * 32
    check_audio(end, 20 * WINDOW, (30 * 32 + 200) * MS)


def test_a_pause_inside_an_utterance_carries_what_its_end_would() -> None:
    seg = TurnSegmenter(classic())  # pause 200 ms, silence 600 ms, pad 200 ms
    events = drive(seg, [0.0] * 10 + [0.9] * 20 + [0.0] * 25, pauses=True)
    assert kinds(events) == ["SpeechStart", "SpeechPause", "SpeechEnd"]
    (fed, pause), (_, end) = events[1], events[2]
    assert isinstance(pause, SpeechPause) and isinstance(end, SpeechEnd)
    assert (pause.start_ms, pause.end_ms) == (end.start_ms, end.end_ms) == (320, 30 * 32)
    np.testing.assert_array_equal(pause.audio, end.audio)  # a speculative final is the final
    assert decided_in_window(fed) == 30 + 6  # 200 ms of silence = 7 windows (224 ms)


def test_one_pause_per_stretch_of_silence_and_none_once_it_ends_the_turn() -> None:
    seg = TurnSegmenter(classic())
    probs = [0.9] * 20 + [0.0] * 10 + [0.9] * 10 + [0.0] * 30
    events = drive(seg, probs, pauses=True)
    assert kinds(events) == ["SpeechStart", "SpeechPause", "SpeechPause", "SpeechEnd"]
    assert [e.end_ms for _, e in events[1:3]] == [20 * 32, 40 * 32]  # type: ignore[union-attr]
    no_pauses = TurnSegmenter(VadSettings(pause_ms=600))  # as long as the turn's silence
    assert kinds(drive(no_pauses, probs, pauses=True)) == ["SpeechStart", "SpeechEnd"]


def test_a_pause_waits_for_the_whole_trailing_pad() -> None:
    seg = TurnSegmenter(VadSettings(pause_ms=64, trailing_pad_ms=300))
    events = drive(seg, [0.9] * 20 + [0.0] * 25, pauses=True)
    fed, pause = events[1]
    assert isinstance(pause, SpeechPause)
    assert decided_in_window(fed) == 20 + 9  # 300 ms (10 windows), not 64 ms
    assert len(pause.audio) == (640 + 300) * MS


def test_more_probabilities_than_audio_is_an_error() -> None:
    seg = TurnSegmenter(classic())
    with pytest.raises(ValueError, match="probabilities"):
        seg.feed(np.zeros(600, np.float32), [0.1, 0.1])


# ---- Silero VAD v6 ----

SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank."


@pytest.fixture(scope="module")
def vad() -> SileroVad:
    return SileroVad()


@pytest.fixture(scope="module")
def sentence() -> Audio:
    return speak(SENTENCE, sample_rate=16000)


def frames(audio: Audio, size: int = FRAME) -> Iterator[Audio]:
    for pos in range(0, len(audio), size):
        yield audio[pos : pos + size]


def test_silence_and_low_noise_give_low_probability(vad: SileroVad) -> None:
    rng = np.random.default_rng(7)
    noise = (rng.standard_normal(32_000) * 0.003).astype(np.float32)
    for audio in (np.zeros(32_000, np.float32), noise):
        probs = vad.new_stream().push(audio)
        assert len(probs) == 32_000 // WINDOW
        assert probs.max() < 0.2


def test_speech_gives_high_probability(vad: SileroVad, sentence: Audio) -> None:
    probs = vad.new_stream().push(sentence)
    assert np.mean(probs > 0.5) > 0.8
    assert np.median(probs) > 0.85


def test_probabilities_do_not_depend_on_chunking(vad: SileroVad, sentence: Audio) -> None:
    audio = np.concatenate([np.zeros(8000, np.float32), sentence])
    whole = vad.new_stream().push(audio)
    for size in (FRAME, 777, 16_000):
        stream = vad.new_stream()
        pieces = np.concatenate([stream.push(f) for f in frames(audio, size)])
        np.testing.assert_allclose(pieces, whole, atol=1e-5)


@pytest.mark.parametrize("batched", [True, False])
def test_process_many_equals_one_stream_at_a_time(
    vad: SileroVad, sentence: Audio, batched: bool
) -> None:
    model = vad if batched else SileroVad(batched=False)
    assert model.batched is batched
    rng = np.random.default_rng(3)
    clips = [sentence[i * 4000 :] * (0.3 + 0.2 * i) for i in range(5)]
    clips.append((rng.standard_normal(20_000) * 0.01).astype(np.float32))
    clips.append(np.zeros(100, np.float32))  # never completes a window
    expected = [model.new_stream().push(c) for c in clips]

    streams = [model.new_stream() for _ in clips]
    got: list[list[Audio]] = [[] for _ in clips]
    sizes = [FRAME * (1 + i) for i in range(len(clips))]  # 0 to 4 windows pending per call
    for tick in range(max(len(c) // size + 1 for c, size in zip(clips, sizes, strict=True))):
        for stream, clip, size in zip(streams, clips, sizes, strict=True):
            stream.append(clip[tick * size : (tick + 1) * size])
        for i, probs in enumerate(model.process_many(streams)):
            got[i].append(probs)
    assert all(s.pending_windows == 0 for s in streams)
    for want, parts in zip(expected, got, strict=True):
        np.testing.assert_allclose(np.concatenate(parts), want, atol=1e-5)


def test_sentence_between_silences_is_one_turn(vad: SileroVad, sentence: Audio) -> None:
    lead, trail = 8000, 16_000
    audio = np.concatenate([np.zeros(lead, np.float32), sentence, np.zeros(trail, np.float32)])
    voiced = np.flatnonzero(np.abs(sentence) > 0.01)
    onset_ms, offset_ms = (lead + voiced[0]) // MS, (lead + voiced[-1]) // MS
    stream, seg = vad.new_stream(), TurnSegmenter(VadSettings())
    heard = [e for f in frames(audio) for e in seg.feed(f, stream.push(f))]
    events = [e for e in heard if not isinstance(e, SpeechPause)]  # between words, maybe
    assert [type(e) for e in events] == [SpeechStart, SpeechEnd]
    start, end = events
    assert isinstance(end, SpeechEnd) and not end.forced
    assert abs(start.start_ms - onset_ms) <= 150
    assert abs(end.end_ms - offset_ms) <= 150
    assert end.start_ms == start.start_ms
    assert len(end.audio) >= (end.end_ms - end.start_ms) * MS


def test_missing_model_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(EngineUnavailable, match="faster-whisper"):
        SileroVad(tmp_path / "nope.onnx")
