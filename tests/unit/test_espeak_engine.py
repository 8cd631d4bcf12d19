"""The espeak-ng engine: real library, real audio (it runs ~500× faster than real time)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from services.common.errors import EngineUnavailable, UnknownVoice
from services.tts.engines.base import AudioF32, SpeechRequest, TtsEngine
from services.tts.engines.espeak import EspeakEngine
from services.tts.settings import EspeakSettings
from tests.speech import speak, to_pcm16

SENTENCE = "The quick brown fox jumps over the lazy dog."
LONGER = "Please call Stella and ask her to bring these things with her from the store."


@pytest.fixture(scope="module")
def engine() -> EspeakEngine:
    engine = EspeakEngine(EspeakSettings(), chunk_ms=200)
    engine.load()
    return engine


def seconds(
    engine: EspeakEngine, text: str, voice: str = "en-us+klatt2", speed: float = 1.0
) -> float:
    chunks = list(engine.synthesize(SpeechRequest(text=text, voice=voice, speed=speed)))
    return sum(chunk.size for chunk in chunks) / engine.sample_rate


def test_describes_itself(engine: EspeakEngine) -> None:
    typed: TtsEngine = engine
    assert (typed.name, typed.device, typed.sample_rate) == ("espeak", "cpu", 22050)
    assert typed.model.startswith("espeak-ng 1.")
    assert typed.default_voice == "en-us"


def test_voices_list_english_and_variants(engine: EspeakEngine) -> None:
    voices = engine.voices()
    assert {"en-us", "en-gb", "en-us+klatt2", "en-gb+klatt4", "de", "fr-fr"} <= set(voices)
    assert voices == sorted(voices)


def test_sentence_has_plausible_duration_and_range(engine: EspeakEngine) -> None:
    chunks = list(engine.synthesize(SpeechRequest(text=SENTENCE, voice="en-us+klatt2")))
    audio = np.concatenate(chunks)
    assert audio.dtype == np.float32
    assert 1.0 < audio.size / engine.sample_rate < 5.0
    assert 0.05 < float(np.abs(audio).max()) <= 1.0


def test_speed_two_is_clearly_shorter(engine: EspeakEngine) -> None:
    normal = seconds(engine, LONGER)
    fast = seconds(engine, LONGER, speed=2.0)
    assert fast < 0.7 * normal


def test_speed_is_clamped_to_espeak_range(engine: EspeakEngine) -> None:
    fastest = seconds(engine, LONGER, speed=450 / 140)
    beyond = seconds(engine, LONGER, speed=50.0)
    assert beyond == pytest.approx(fastest, rel=0.1)


@pytest.mark.parametrize("chunk_ms", [40, 200])
def test_chunks_have_chunk_ms(chunk_ms: int) -> None:
    engine = EspeakEngine(EspeakSettings(), chunk_ms=chunk_ms)
    engine.load()
    sizes = [c.size for c in engine.synthesize(SpeechRequest(text=LONGER, voice="en-us"))]
    expected = engine.sample_rate * chunk_ms // 1000
    assert len(sizes) > 3
    assert set(sizes[:-1]) == {expected}
    assert 0 < sizes[-1] <= expected


@pytest.mark.parametrize("voice", ["xx-nope", "en-us+nope", "en-us+klatt2+klatt3", "+klatt2"])
def test_unknown_voice_is_refused_before_streaming(engine: EspeakEngine, voice: str) -> None:
    with pytest.raises(UnknownVoice):
        engine.synthesize(SpeechRequest(text=SENTENCE, voice=voice))


@pytest.mark.parametrize("text", ["", "   ", "\n\t "])
def test_empty_text_yields_nothing(engine: EspeakEngine, text: str) -> None:
    assert list(engine.synthesize(SpeechRequest(text=text, voice="en-us+klatt2"))) == []


def test_unknown_default_voice_fails_load() -> None:
    with pytest.raises(EngineUnavailable, match="DEFAULT_VOICE"):
        EspeakEngine(EspeakSettings(default_voice="klingon")).load()


def test_stopping_early_releases_the_library(engine: EspeakEngine) -> None:
    stream = engine.synthesize(SpeechRequest(text=" ".join([LONGER] * 20), voice="en-us"))
    first = next(stream)
    stream.close()  # type: ignore[attr-defined]
    assert first.size > 0
    assert 1.0 < seconds(engine, SENTENCE) < 5.0


def test_concurrent_syntheses_each_get_their_own_audio(engine: EspeakEngine) -> None:
    texts = [SENTENCE, LONGER, SENTENCE, LONGER]
    reference = {text: seconds(engine, text) for text in set(texts)}
    results: dict[int, list[float]] = {}
    start = threading.Barrier(len(texts))

    def run(index: int, text: str) -> None:
        start.wait()
        results[index] = [seconds(engine, text) for _ in range(5)]

    threads = [threading.Thread(target=run, args=item) for item in enumerate(texts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    for index, text in enumerate(texts):
        assert results[index] == pytest.approx([reference[text]] * 5, rel=0.05)


def test_speech_helper_gives_dithered_16k_audio() -> None:
    audio: AudioF32 = speak(SENTENCE)
    assert audio.dtype == np.float32
    assert 1.0 < audio.size / 16000 < 5.0
    assert np.count_nonzero(audio) == audio.size  # dither: no digital silence
    assert len(to_pcm16(audio)) == 2 * audio.size
    assert speak(SENTENCE, sample_rate=24000).size == pytest.approx(audio.size * 1.5, rel=0.05)


def test_has_voice_knows_unlisted_pairs_and_the_synthesizer_uses_it(engine: EspeakEngine) -> None:
    from services.common.errors import UnknownVoice
    from services.tts.synthesizer import Synthesizer

    assert "de+klatt2" not in engine.voices()  # only English pairs are listed
    assert engine.has_voice("de+klatt2") and engine.has_voice("en-us")
    assert not engine.has_voice("xx-nope") and not engine.has_voice("en-us+nope")
    synthesizer = Synthesizer(engine, max_concurrent=1, max_queue=1, chunk_ms=200)
    assert synthesizer.resolve_voice("de+klatt2") == "de+klatt2"
    with pytest.raises(UnknownVoice):
        synthesizer.resolve_voice("en-us+nope")
