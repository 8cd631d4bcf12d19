"""The `fake` engines: instant ASR and TTS of known shape and cost (the profile: test_profiles)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from services.asr.engines import create_engine as create_asr_engine
from services.asr.engines.base import AsrEngine, AsrInput
from services.asr.engines.fake import FakeAsrEngine
from services.asr.settings import AsrSection, FakeAsrSettings
from services.common.errors import UnknownVoice
from services.tts.engines import create_engine as create_tts_engine
from services.tts.engines.base import AudioF32, LibraryVoice, SpeechRequest, TtsEngine
from services.tts.engines.fake import FakeTtsEngine
from services.tts.settings import FakeTtsSettings, TtsSection
from services.tts.synthesizer import Synthesizer

THREE_WORDS = "one two three"


def utterance(seconds: float, language: str | None = None) -> AsrInput:
    return AsrInput(np.zeros(round(16000 * seconds), np.float32), language)


def tts(
    chunk_ms: int = 200, sleep: Callable[[float], None] = time.sleep, **settings: float
) -> FakeTtsEngine:
    return FakeTtsEngine(FakeTtsSettings(**settings), chunk_ms=chunk_ms, sleep=sleep)


def chunks(engine: FakeTtsEngine, text: str, speed: float = 1.0) -> list[AudioF32]:
    return list(engine.synthesize(SpeechRequest(text=text, voice="fake", speed=speed)))


# ASR


def test_asr_hears_hello_there_by_default() -> None:
    engine: AsrEngine = create_asr_engine(AsrSection(engine="fake"))
    engine.load()
    assert (engine.name, engine.sample_rate, engine.device) == ("fake", 16000, "cpu")
    [heard] = engine.transcribe_batch([utterance(1.5)])
    assert (heard.text, heard.language, heard.duration_s) == ("hello there", "en", 1.5)


def test_asr_text_is_configurable_and_the_language_passes_through() -> None:
    engine = FakeAsrEngine(FakeAsrSettings(text="turn the lights on"))
    heard = engine.transcribe_batch([utterance(0.5, "de"), utterance(0.2)])
    assert [(t.text, t.language) for t in heard] == [
        ("turn the lights on", "de"),
        ("turn the lights on", "en"),
    ]


def test_asr_latency_is_paid_once_per_batch() -> None:
    slept: list[float] = []
    engine = FakeAsrEngine(FakeAsrSettings(latency_ms=80), sleep=slept.append)
    heard = engine.transcribe_batch([utterance(1.0) for _ in range(5)])
    assert len(heard) == 5 and engine.calls == 1
    assert slept == [pytest.approx(0.08)]  # one batch's cost, not five
    engine.transcribe_batch([utterance(1.0)])
    assert slept == [pytest.approx(0.08)] * 2 and engine.calls == 2


def test_asr_latency_sleeps_by_default() -> None:
    engine = FakeAsrEngine(FakeAsrSettings(latency_ms=30))
    started = time.perf_counter()
    engine.transcribe_batch([utterance(0.5)])
    assert time.perf_counter() - started >= 0.03


def test_asr_without_latency_does_not_wait() -> None:
    slept: list[float] = []
    engine = FakeAsrEngine(FakeAsrSettings(), sleep=slept.append)
    engine.transcribe_batch([utterance(1.0) for _ in range(16)])
    assert slept == [] and engine.calls == 1


# TTS


def test_tts_describes_itself_and_speaks_any_voice() -> None:
    engine: TtsEngine = create_tts_engine(TtsSection(engine="fake"))
    engine.load()
    assert (engine.name, engine.sample_rate, engine.default_voice) == ("fake", 24000, "fake")
    assert engine.voices() == ["fake"]
    assert engine.has_voice("fake") and engine.has_voice("en-us+klatt2")
    assert not engine.has_voice("")


def test_tts_audio_lasts_ms_per_word() -> None:
    audio = np.concatenate(chunks(tts(), THREE_WORDS))
    assert audio.size == 3 * 300 * 24  # 900 ms at 24 kHz
    slow = np.concatenate(chunks(tts(ms_per_word=500), "one two three four"))
    assert slow.size == 4 * 500 * 24
    fast = np.concatenate(chunks(tts(), THREE_WORDS, speed=2.0))
    assert fast.size == audio.size // 2


def test_tts_is_a_quiet_tone_not_silence() -> None:
    audio = np.concatenate(chunks(tts(level_dbfs=-30), "a few words of speech"))
    peak = float(np.abs(audio).max())
    assert peak == pytest.approx(10 ** (-30 / 20), rel=0.01)
    assert float(np.sqrt(np.mean(audio**2))) > 0.5 * peak / np.sqrt(2)  # sound all along
    assert abs(audio[0]) < 0.01 * peak and abs(audio[-1]) < 0.01 * peak  # faded ends
    spectrum = np.abs(np.fft.rfft(audio))
    assert np.argmax(spectrum) * 24000 / audio.size == pytest.approx(440, abs=2)


def test_tts_chunks_have_the_chunk_size_and_join_seamlessly() -> None:
    parts = chunks(tts(chunk_ms=100), THREE_WORDS)
    assert [p.size for p in parts] == [2400] * 9
    whole = np.concatenate(chunks(tts(chunk_ms=5000), THREE_WORDS))
    assert np.array_equal(np.concatenate(parts), whole)
    odd = chunks(tts(chunk_ms=200), "one two")  # 600 ms: 200 + 200 + 200
    assert [p.size for p in odd] == [4800] * 3
    assert [p.size for p in chunks(tts(chunk_ms=250), "one two")] == [6000, 6000, 2400]


def test_tts_empty_text_is_no_audio() -> None:
    assert chunks(tts(), "") == [] and chunks(tts(), "   ") == []


def test_tts_stops_between_chunks_when_asked() -> None:
    asked = 0

    def should_stop() -> bool:
        nonlocal asked
        asked += 1
        return asked > 2

    request = SpeechRequest(text="a long answer " * 10, voice="fake", should_stop=should_stop)
    assert len(list(tts().synthesize(request))) == 2


def test_tts_first_chunk_latency_is_paid_before_the_first_chunk_only() -> None:
    slept: list[float] = []
    engine = tts(first_chunk_latency_ms=60, sleep=slept.append)
    stream = iter(engine.synthesize(SpeechRequest(text=THREE_WORDS, voice="fake")))
    assert slept == []  # nothing paid before the first chunk is asked for
    next(stream)
    assert slept == [pytest.approx(0.06)]
    assert len(list(stream)) == 4  # the other 800 ms of the 900, at once
    assert slept == [pytest.approx(0.06)]


def test_tts_first_chunk_latency_sleeps_by_default() -> None:
    stream = tts(first_chunk_latency_ms=30).synthesize(SpeechRequest(text="one", voice="fake"))
    started = time.perf_counter()
    next(iter(stream))
    assert time.perf_counter() - started >= 0.03


@pytest.mark.parametrize("rate", [8000, 16000, 24000, 48000])
async def test_tts_through_the_synthesizer_at_any_rate(rate: int) -> None:
    synthesizer = Synthesizer(tts(), max_concurrent=2, max_queue=4, chunk_ms=200)
    request = SpeechRequest(text=THREE_WORDS, voice=synthesizer.resolve_voice("alloy"))
    parts = [chunk async for chunk in synthesizer.stream(request, rate)]
    assert [p.size for p in parts[:-1]] == [rate // 5] * (len(parts) - 1)
    assert sum(p.size for p in parts) == pytest.approx(0.9 * rate, abs=rate // 100)
    assert float(np.abs(np.concatenate(parts)).max()) > 0.02


def test_tts_library_voice_speaks_the_default() -> None:
    assert tts().library_voice(LibraryVoice("v_1", Path("clip.wav"))) == "fake"


async def test_synthesizer_still_refuses_an_empty_voice_name() -> None:
    synthesizer = Synthesizer(tts(), max_concurrent=1, max_queue=1, chunk_ms=200)
    with pytest.raises(UnknownVoice):
        synthesizer.resolve_voice("")
