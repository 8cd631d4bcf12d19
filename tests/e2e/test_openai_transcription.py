"""The official `openai` SDK against the ASR service's REST doors: models, `model=`,
verbose_json with real segments and word timestamps, srt/vtt, translations, long files,
language detection (a tiny random-weight multilingual Whisper built on the spot)."""

from __future__ import annotations

import io
from collections.abc import Iterator

import numpy as np
import openai
import pytest

from services.asr.app import create_app
from services.asr.settings import AsrSection, AsrSettings, ModelsSettings, WhisperSettings
from services.common.audio.pcm import encode_audio
from tests.conftest import RedisProc
from tests.e2e.wire import recall
from tests.servers import ServerThread
from tests.speech import piper_speech, speak
from tests.tiny_whisper import LANGUAGES, build_tiny_whisper

SENTENCE = "what is the weather like in paris today"
LATER = "thank you very much for your help"
RANDOM = "tiny-random"
"""A random-weight multilingual Whisper in the models folder: served on first use."""


@pytest.fixture(scope="module")
def asr(
    redis_server: RedisProc, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerThread]:
    models_dir = tmp_path_factory.mktemp("models")
    build_tiny_whisper(models_dir / f"faster-whisper-{RANDOM}")
    section = AsrSection(
        whisper=WhisperSettings(models_dir=models_dir),
        models=ModelsSettings(discover=True),
    )
    settings = AsrSettings(profile="lite", redis=redis_server.settings(), asr=section)
    with ServerThread(create_app(settings)) as server:
        yield server


@pytest.fixture(scope="module")
def client(asr: ServerThread) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{asr.http}/v1", api_key="sk-local", max_retries=0, timeout=60
    ) as sdk:
        yield sdk


def _wav(audio: np.ndarray) -> tuple[str, io.BytesIO]:
    return ("speech.wav", io.BytesIO(encode_audio(audio, 16000, "wav")))


def test_models_are_listed_and_retrieved(client: openai.OpenAI) -> None:
    listed = {model.id: model for model in client.models.list()}
    assert next(iter(listed)) == "tiny.en"
    assert RANDOM in listed
    default = listed["tiny.en"].model_dump()
    assert default["default"] is True and default["loaded"] is True
    assert default["languages"] == ["en"]
    assert {"whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe"} <= set(default["aliases"])
    assert client.models.retrieve("tiny.en").id == "tiny.en"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


@pytest.mark.parametrize("model", ["whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe"])
def test_openai_model_names_mean_the_default(client: openai.OpenAI, model: str) -> None:
    text = client.audio.transcriptions.create(
        model=model, file=_wav(speak(SENTENCE)), response_format="text"
    )
    assert recall(SENTENCE, text) >= 0.8, text


def test_a_phone_recording_is_heard_with_its_band_folded(
    client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An 8 kHz upload is telephone-band speech: the engine folds its top octave (the
    batched door and the whole-file door alike); a 16 kHz one is left as it is. (Piper's
    voice: espeak's loses words at 8 kHz, which is not what this checks.)"""
    from services.asr.engines import whisper

    folded: list[int] = []

    def fold(audio: np.ndarray, rate: int, gain: float) -> np.ndarray:
        folded.append(audio.size)
        return whisper_fold(audio, rate, gain)

    whisper_fold = whisper.fold_phone_band
    monkeypatch.setattr(whisper, "fold_phone_band", fold)
    phone = piper_speech(SENTENCE, 8000)

    def call() -> tuple[str, io.BytesIO]:
        return ("call.wav", io.BytesIO(encode_audio(phone, 8000, "wav")))

    text = client.audio.transcriptions.create(
        model="whisper-1", file=call(), response_format="text"
    )
    timed = client.audio.transcriptions.create(
        model="whisper-1", file=call(), response_format="verbose_json"
    )
    assert len(folded) == 2
    for heard in (text, timed.text):
        assert recall(SENTENCE, heard) >= 0.6, heard
    client.audio.transcriptions.create(model="whisper-1", file=_wav(speak(SENTENCE)))
    assert len(folded) == 2


def test_an_unknown_model_is_a_bad_request_naming_the_known(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.audio.transcriptions.create(model="whisper-9", file=_wav(speak("hello")))
    body = refused.value.body
    assert isinstance(body, dict)
    assert "unknown model 'whisper-9'" in body["message"]
    assert "tiny.en" in body["message"] and RANDOM in body["message"]


def test_another_model_loads_on_first_use_and_detects_the_language(
    client: openai.OpenAI,
) -> None:
    result = client.audio.transcriptions.create(
        model=RANDOM, file=_wav(speak(SENTENCE)), response_format="verbose_json"
    )
    assert result.language in LANGUAGES  # the random model's guess, from the audio
    assert result.duration == pytest.approx(speak(SENTENCE).size / 16000, abs=0.01)
    listed = {model.id: model.model_dump() for model in client.models.list()}
    assert listed[RANDOM]["loaded"] is True
    assert listed[RANDOM]["load"] == "first use"
    assert set(LANGUAGES) <= set(listed[RANDOM]["languages"])


def test_verbose_json_has_segments_scores_and_words(client: openai.OpenAI) -> None:
    audio = speak(SENTENCE)
    result = client.audio.transcriptions.create(
        model="whisper-1",
        file=_wav(audio),
        response_format="verbose_json",
        timestamp_granularities=["word", "segment"],
    )
    duration = audio.size / 16000
    assert recall(SENTENCE, result.text) >= 0.8, result.text
    assert result.segments, result
    for segment in result.segments:
        assert 0.0 <= segment.start < segment.end <= duration + 0.5
        assert -3.0 < segment.avg_logprob < 0.0  # a real score, not a placeholder 0
        assert 0.0 <= segment.no_speech_prob <= 1.0
        assert segment.tokens
    assert result.words is not None
    spoken = [w.word for w in result.words]
    assert recall(SENTENCE, " ".join(spoken)) >= 0.8, spoken
    starts = [w.start for w in result.words]
    assert starts == sorted(starts)
    assert all(w.start <= w.end <= duration + 0.5 for w in result.words)
    assert result.words[-1].end > duration / 2  # the words span the speech


def test_words_alone_leave_segments_out(client: openai.OpenAI) -> None:
    result = client.audio.transcriptions.create(
        model="whisper-1",
        file=_wav(speak("good morning")),
        response_format="verbose_json",
        timestamp_granularities=["word"],
    )
    assert result.words and result.segments is None


def test_a_file_longer_than_the_window_is_heard_whole(client: openai.OpenAI) -> None:
    """31 s: the first sentence, silence, the second past Whisper's 30 s window."""
    first, second = speak(SENTENCE), speak(LATER)
    gap = np.zeros(16000 * 31 - first.size - second.size, np.float32)
    audio = np.concatenate([first, gap, second])
    result = client.audio.transcriptions.create(
        model="whisper-1", file=_wav(audio), response_format="srt"
    )
    cues = [block.splitlines() for block in result.strip().split("\n\n")]
    assert [cue[0] for cue in cues] == [str(i) for i in range(1, len(cues) + 1)]
    assert cues[-1][1].split(" --> ")[1] >= "00:00:30", cues  # past the first window
    text = " ".join(" ".join(cue[2:]) for cue in cues)
    assert recall(SENTENCE, text) >= 0.8 and recall(LATER, text) >= 0.7, text


def test_vtt_cues(client: openai.OpenAI) -> None:
    result = client.audio.transcriptions.create(
        model="whisper-1", file=_wav(speak(SENTENCE)), response_format="vtt"
    )
    lines = result.strip().splitlines()
    assert lines[0] == "WEBVTT" and lines[1] == ""
    start, arrow, end = lines[2].split()
    assert arrow == "-->" and start < end and end.startswith("00:00:0")
    assert recall(SENTENCE, " ".join(lines[3:])) >= 0.8


def test_a_prompt_steers_the_spelling(client: openai.OpenAI) -> None:
    """Whisper writes a name as the prompt spells it: the prompt reached the model."""
    audio = speak("my name is kaitlyn")
    plain = client.audio.transcriptions.create(model="whisper-1", file=_wav(audio))
    prompted = client.audio.transcriptions.create(
        model="whisper-1", file=_wav(audio), prompt="Names: Kaytlinn Smyth."
    )
    assert "Kaytlinn" in prompted.text, (plain.text, prompted.text)
    assert "Kaytlinn" not in plain.text


@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")  # the SDK's, not ours
def test_translation_needs_a_multilingual_model(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.audio.translations.create(model="whisper-1", file=_wav(speak(SENTENCE)))
    assert "English-only and cannot translate" in str(refused.value.body)
    result = client.audio.translations.create(
        model=RANDOM, file=_wav(speak(SENTENCE)), response_format="verbose_json"
    )
    assert result.language == "en"
    assert isinstance(result.text, str)


@pytest.mark.parametrize("response_format", ["srt", "json", "text"])
def test_a_language_the_model_does_not_know_is_refused(
    client: openai.OpenAI, response_format: str
) -> None:
    """Whichever path serves the format: the whole-file one (srt) or the batched one
    (json, text), which used to detect a language instead."""
    with pytest.raises(openai.BadRequestError) as refused:
        client.audio.transcriptions.create(
            model="whisper-1",
            file=_wav(speak("hello")),
            language="de",
            response_format=response_format,  # type: ignore[call-overload]
        )
    assert "knows English only" in str(refused.value.body)
    with pytest.raises(openai.BadRequestError) as refused:
        client.audio.transcriptions.create(
            model=RANDOM,
            file=_wav(speak("hello")),
            language="xx",
            response_format=response_format,  # type: ignore[call-overload]
        )
    assert "'xx' is not one model" in str(refused.value.body)
