"""The shared listener: when a partial is due, and hearing many sessions in one VAD call."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from services.common.audio.listener import HearingBatcher, Listener, to_vad_rate
from services.common.audio.pcm import float_to_pcm16
from services.common.audio.turns import TurnEvent
from services.common.audio.vad import WINDOW, SileroVad, VadSettings
from services.common.errors import FrameTooBig, InvalidAudio
from tests.speech import speak

SENTENCES = (
    "the weather is nice today",
    "please open the window",
    "what time is it in tokyo",
    "turn left at the next corner",
)


def _utterance(sentence: str) -> bytes:
    """Half a second of quiet, the sentence, then a second of silence (the turn ends)."""
    speech = float_to_pcm16(np.concatenate([np.zeros(8000, np.float32), speak(sentence)]))
    return speech + bytes(2 * 16000)


def _margin(vad: SileroVad, settings: VadSettings, pcm: bytes) -> float:
    """How far the VAD's least clear window is from its thresholds."""
    probabilities = vad.new_stream().push(np.frombuffer(pcm, np.int16).astype(np.float32) / 32768)
    edges = (settings.threshold, settings.effective_neg_threshold)
    return min(abs(float(p) - edge) for p in probabilities for edge in edges)


def feed(listener: Listener, probs: list[float]) -> None:
    audio = np.zeros(WINDOW * len(probs), dtype=np.float32)
    listener.segmenter.feed(audio, np.array(probs, dtype=np.float32))


def test_partial_due_only_while_speaking_and_after_the_interval() -> None:
    settings = VadSettings(min_speech_ms=64, min_silence_ms=640)
    listener = Listener(SileroVad(), settings, 16000)
    assert not listener.partial_due(0, 500)  # not in speech
    feed(listener, [0.9] * 20)  # 640 ms of speech
    assert listener.segmenter.in_speech
    assert listener.partial_due(0, 500)
    assert not listener.partial_due(listener.segmenter.position_ms - 100, 500)  # too soon
    assert not listener.partial_due(0, 0)  # partials off
    feed(listener, [0.05] * 3)  # trailing silence: the turn may be ending
    assert listener.segmenter.in_speech and listener.segmenter.trailing_silence_ms > 0
    assert not listener.partial_due(0, 500)
    feed(listener, [0.9] * 2)  # speaking again
    assert listener.partial_due(0, 500)


@pytest.mark.parametrize(
    ("pcm", "error"),
    [(b"", InvalidAudio), (bytes(3), InvalidAudio), (bytes(32002), FrameTooBig)],
    ids=["empty", "odd", "over-1s"],
)
async def test_frames_the_contract_refuses(pcm: bytes, error: type[Exception]) -> None:
    listener = Listener(SileroVad(), VadSettings(), 16000)
    with pytest.raises(error):
        listener.push(pcm)
    with pytest.raises(error):
        await listener.push_batched(pcm)
    assert listener.push(bytes(2)) == []  # one sample (a stream's short last frame) is heard


async def test_batched_hearing_gives_each_listener_what_hearing_alone_gives() -> None:
    vad = SileroVad()
    settings = VadSettings()
    # The VAD's decisions must sit off its thresholds, or a batched run's probabilities
    # (other shapes: sums that differ in the last bits, ~1e-7, and more across CPUs) could
    # flip one: take the first sentence whose every window is 1e-4 clear of both
    # thresholds (windows at speech edges take any value; espeak's timing varies a little).
    speech = next(
        (pcm for pcm in map(_utterance, SENTENCES) if _margin(vad, settings, pcm) > 1e-4), None
    )
    assert speech is not None, "no candidate sentence is clear of the VAD's thresholds"
    frames = [speech[i : i + 640] for i in range(0, len(speech), 640)]  # 20 ms

    alone = Listener(vad, settings, 16000)
    expected = [event for frame in frames for event in alone.push(frame)]
    kinds = [type(e).__name__ for e in expected if type(e).__name__ != "SpeechPause"]
    assert kinds == ["SpeechStart", "SpeechEnd"]

    batcher = HearingBatcher(vad)
    listeners = [Listener(vad, settings, 16000, batcher) for _ in range(6)]

    async def session(listener: Listener, offset: int) -> list[TurnEvent]:
        await asyncio.sleep(offset * 0.001)  # sessions out of step with each other
        return [event for frame in frames for event in await listener.push_batched(frame)]

    heard = await asyncio.gather(*(session(listener, i) for i, listener in enumerate(listeners)))
    for events in heard:
        assert [(type(e), e.start_ms) for e in events] == [(type(e), e.start_ms) for e in expected]
        assert np.array_equal(events[-1].audio, expected[-1].audio)  # type: ignore[union-attr]
    # only frames that complete a 32 ms window go to the model; the others skip it
    ends = np.cumsum([len(frame) // 2 for frame in frames])
    windowed = int(np.count_nonzero(np.diff(ends // WINDOW, prepend=0)))
    assert windowed < len(frames)
    assert batcher.streams_run == 6 * windowed
    assert batcher.streams_run / batcher.calls >= 2  # several sessions per model call


@pytest.mark.parametrize("rate", [8000, 24000, 48000])
def test_every_input_rate_reaches_the_vad_frame_by_frame(rate: int) -> None:
    """Each 20 ms frame gives the VAD its 20 ms at once: nothing held back in blocks (soxr's
    stream resampler kept up to 40 ms of a 24 kHz stream, so the end of the speech was
    heard that much later), and nothing lost over the stream."""
    resampler = to_vad_rate(rate)
    frame = np.random.default_rng(0).uniform(-0.5, 0.5, rate // 50).astype(np.float32)
    sizes = [resampler.process(frame).size for _ in range(50)]
    assert sizes == [320] * 50
    assert resampler.delay_ms < 5
