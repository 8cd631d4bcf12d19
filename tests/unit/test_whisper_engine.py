"""The faster-whisper engine on a tiny random-weight model: offline, batched, exact."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from services.asr.engines.base import AsrInput, FileRequest, Transcript
from services.asr.engines.whisper import FasterWhisperEngine, max_new_tokens
from services.asr.engines.whisper_files import resolve_model_dir
from services.asr.engines.whisper_scores import last_word, token_logprob
from services.asr.settings import WhisperSettings
from services.common.errors import EngineUnavailable
from tests.speech import speak
from tests.tiny_whisper import VOCAB_SIZE, build_tiny_whisper, offline

RATE = 16000


@pytest.fixture(scope="module", autouse=True)
def no_network() -> Iterator[None]:
    """Nothing in this module may reach the network."""
    with offline():
        yield


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_whisper(tmp_path_factory.mktemp("tiny-whisper"))


@pytest.fixture(scope="module")
def engine(model_dir: Path, no_network: None) -> FasterWhisperEngine:
    engine = FasterWhisperEngine(WhisperSettings(model=str(model_dir), device="cpu"))
    engine.load()
    return engine


def _tone(freq: float, seconds: float) -> np.ndarray[Any, np.dtype[np.float32]]:
    t = np.arange(int(RATE * seconds)) / RATE
    return (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def _noise(seconds: float, seed: int) -> np.ndarray[Any, np.dtype[np.float32]]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(int(RATE * seconds)) * 0.2).astype(np.float32)


def _utterances() -> list[AsrInput]:
    return [
        AsrInput(_tone(200, 1.0)),
        AsrInput(_noise(2.5, seed=1), language="en"),
        AsrInput(_tone(4000, 0.7), language="de"),
        AsrInput(_noise(6.0, seed=2)),
        AsrInput(_tone(440, 12.0), language="ja"),
    ]


def test_tiny_model_builds_small(tmp_path: Path) -> None:
    folder = build_tiny_whisper(tmp_path / "m")
    size = sum(f.stat().st_size for f in folder.iterdir())
    names = {f.name for f in folder.iterdir()}
    assert {"config.json", "model.bin", "tokenizer.json", "preprocessor_config.json"} <= names
    assert size < 10_000_000


def test_tiny_tokenizer_follows_whisper_layout(model_dir: Path) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == VOCAB_SIZE
    expected = {
        "Ġ": 220,
        "<|endoftext|>": 50257,
        "<|startoftranscript|>": 50258,
        "<|en|>": 50259,
        "<|su|>": 50357,
        "<|translate|>": 50358,
        "<|transcribe|>": 50359,
        "<|nocaptions|>": 50362,
        "<|notimestamps|>": 50363,
        "<|0.00|>": 50364,
        "<|30.00|>": 51864,
    }
    assert {token: tokenizer.token_to_id(token) for token in expected} == expected
    vocabulary = json.loads((model_dir / "vocabulary.json").read_text(encoding="utf-8"))
    assert len(vocabulary) == VOCAB_SIZE
    assert "" in vocabulary


def test_loads_from_folder_offline(engine: FasterWhisperEngine, model_dir: Path) -> None:
    assert engine.name == "faster-whisper"
    assert engine.sample_rate == RATE
    assert engine.model == str(model_dir)
    assert engine.device == "cpu"


def test_transcribes_silence_and_noise(engine: FasterWhisperEngine) -> None:
    items = [AsrInput(np.zeros(RATE, dtype=np.float32)), AsrInput(_noise(1.5, seed=3), "en")]
    results = engine.transcribe_batch(items)
    assert len(results) == 2
    assert all(isinstance(r.text, str) for r in results)
    assert results[0].language is not None
    assert results[1].language == "en"
    assert [r.duration_s for r in results] == [1.0, 1.5]


def test_empty_audio_gives_empty_text(engine: FasterWhisperEngine) -> None:
    empty = AsrInput(np.zeros(0, dtype=np.float32))
    results = engine.transcribe_batch([empty, AsrInput(_tone(300, 0.5)), empty])
    assert results[0].text == "" and results[2].text == ""
    assert results[0].duration_s == 0.0
    assert engine.transcribe_batch([]) == []


def test_telephone_band_speech_alone_is_folded(
    engine: FasterWhisperEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only speech captured at 8 kHz (a phone line, an 8 kHz upload) is widened, by
    both doors, with the configured gain."""
    from services.asr.engines import whisper

    folded: list[tuple[int, int, float]] = []

    def fold(audio: np.ndarray[Any, Any], rate: int, gain: float) -> np.ndarray[Any, Any]:
        folded.append((audio.size, rate, gain))
        return audio

    monkeypatch.setattr(whisper, "fold_phone_band", fold)
    phone = _tone(3000, 0.5)
    items = [AsrInput(phone, "en", 8000), AsrInput(phone, "en"), AsrInput(phone, "en", 16000)]
    engine.transcribe_batch(items)
    assert folded == [(phone.size, RATE, 0.5)]
    engine.transcribe_file(FileRequest(audio=phone, language="en", source_rate=8000))
    engine.transcribe_file(FileRequest(audio=phone, language="en", source_rate=44100))
    assert folded == [(phone.size, RATE, 0.5)] * 2


SCORE_TOLERANCE = 0.01
"""How far a model score (a log-probability) may move with the batch's shape: the CPU
kernels do not promise bit-identical sums for other shapes (AVX2 and AVX-512 differ)."""


def assert_same_transcripts(got: list[Transcript], want: list[Transcript]) -> None:
    """What batching must preserve exactly (words, language, timing) and model scores
    within SCORE_TOLERANCE (a runaway's score, cut to its cap, included)."""
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert (a.text, a.language, a.duration_s, a.segments) == (
            b.text,
            b.language,
            b.duration_s,
            b.segments,
        )
        for score in ("avg_logprob", "last_word_logprob"):
            x, y = getattr(a, score), getattr(b, score)
            assert (x is None) == (y is None), score
            if x is not None:
                assert x == pytest.approx(y, abs=SCORE_TOLERANCE), (score, a.text)


def test_batched_equals_one_at_a_time(engine: FasterWhisperEngine) -> None:
    items = _utterances()
    batched = engine.transcribe_batch(items)
    single = [engine.transcribe_batch([item])[0] for item in items]
    assert_same_transcripts(batched, single)
    assert len({r.text for r in batched}) > 1, "the tiny model should not answer everything alike"
    assert_same_transcripts(engine.transcribe_batch(items[::-1]), single[::-1])


def test_a_runaway_scores_the_same_alone_or_beside_longer_items(
    engine: FasterWhisperEngine,
) -> None:
    """The random model runs to its cap: a short item cut to its own limit kept the score
    of a longer generation when batched beside a long item (issue 30: -1.37 vs -1.19)."""
    short = AsrInput(_tone(4000, 0.7), language="de")
    alone = engine.transcribe_batch([short])[0]
    beside = engine.transcribe_batch([AsrInput(_noise(6.0, seed=2)), short])[1]
    assert len(alone.text) > 0
    assert_same_transcripts([beside], [alone])


class _CountingModel:
    """Wraps the CTranslate2 model and counts its calls."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            return attr(*args, **kwargs)

        return counted


@pytest.mark.parametrize(
    ("items", "windows", "detections"),
    [
        (_utterances()[:4], 1, 1),  # all under 9 s: the 10 s window
        (_utterances(), 2, 1),  # and a 12 s one (in Japanese: no detection): 20 s
    ],
)
def test_a_batch_is_one_encode_and_one_generate_per_window(
    engine: FasterWhisperEngine, items: list[AsrInput], windows: int, detections: int
) -> None:
    whisper = engine._whisper
    counting = _CountingModel(whisper.model)
    whisper.model = counting
    try:
        engine.transcribe_batch(items)
    finally:
        whisper.model = counting.inner
    assert counting.calls == {
        "encode": windows,
        "detect_language": detections,
        "generate": windows,
    }


def test_unknown_language_is_detected(engine: FasterWhisperEngine) -> None:
    (result,) = engine.transcribe_batch([AsrInput(_tone(500, 1.0), language="xx")])
    assert result.language is not None and result.language != "xx"


def test_longer_than_30_s_is_trimmed(engine: FasterWhisperEngine) -> None:
    (result,) = engine.transcribe_batch([AsrInput(_noise(31.0, seed=4), language="en")])
    assert result.duration_s == 31.0
    assert isinstance(result.text, str)


def test_missing_model_names_the_pull_command(tmp_path: Path) -> None:
    settings = WhisperSettings(model="large-v3-turbo", models_dir=tmp_path, device="cpu")
    engine = FasterWhisperEngine(settings)
    with pytest.raises(EngineUnavailable) as info:
        engine.load()
    message = info.value.message
    assert "voice-agent models pull faster-whisper-large-v3-turbo" in message
    assert str(tmp_path / "faster-whisper-large-v3-turbo") in message
    assert "VA_ASR__WHISPER__MODEL" in message


def test_missing_folder_path_is_explained(tmp_path: Path) -> None:
    engine = FasterWhisperEngine(WhisperSettings(model=str(tmp_path / "nope"), device="cpu"))
    with pytest.raises(EngineUnavailable, match="no faster-whisper model folder"):
        engine.load()


def test_missing_tokenizer_is_a_clear_error(model_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "faster-whisper-tiny"
    shutil.copytree(model_dir, folder)
    (folder / "tokenizer.json").unlink()
    engine = FasterWhisperEngine(WhisperSettings(model="tiny", models_dir=tmp_path, device="cpu"))
    with pytest.raises(EngineUnavailable, match=r"no tokenizer\.json in .*faster-whisper-tiny"):
        engine.load()


def test_not_loaded_refuses(model_dir: Path) -> None:
    engine = FasterWhisperEngine(WhisperSettings(model=str(model_dir), device="cpu"))
    with pytest.raises(EngineUnavailable, match="not loaded"):
        engine.transcribe_batch([AsrInput(_tone(300, 0.5))])


def test_model_folder_resolution(tmp_path: Path, model_dir: Path) -> None:
    by_name = WhisperSettings(model="small", models_dir=tmp_path)
    assert resolve_model_dir(by_name) == tmp_path / "faster-whisper-small"
    assert resolve_model_dir(WhisperSettings(model=str(model_dir))) == model_dir


def test_output_is_bounded_by_duration() -> None:
    assert max_new_tokens(0.5) < max_new_tokens(5.0) < max_new_tokens(30.0) == 224


@pytest.mark.parametrize(
    ("min_window_s", "frames", "window"),
    [(10.0, 350, 1000), (10.0, 900, 1000), (10.0, 901, 2000), (10.0, 2950, 3000), (30.0, 1, 3000)],
)
def test_encoder_windows_are_whole_multiples_of_the_least(
    model_dir: Path, min_window_s: float, frames: int, window: int
) -> None:
    engine = FasterWhisperEngine(
        WhisperSettings(model=str(model_dir), device="cpu", min_window_s=min_window_s, warmup=False)
    )
    engine.load()
    assert engine._window_frames(frames) == window


@pytest.mark.parametrize(
    ("pieces", "span"),
    [
        ([" I", " need", " a", " rec", "ipe", "."], (3, 5)),
        ([" Please", " remind", " me", " to", "..."], (3, 4)),
        (["Hello"], (0, 1)),
        ([" at", " 7", "."], (1, 2)),
        (["...", "?"], None),
        ([], None),
    ],
)
def test_the_last_words_tokens(pieces: list[str], span: tuple[int, int] | None) -> None:
    assert last_word(pieces) == span


def test_a_tokens_log_probability_from_its_steps_logits() -> None:
    logits = np.log(np.array([[0.7, 0.2, 0.1], [0.25, 0.25, 0.5]]))
    assert token_logprob(logits[0] + 3.0, 0) == pytest.approx(np.log(0.7))
    assert token_logprob(logits[1], 2) == pytest.approx(np.log(0.5))


def test_tiny_en_says_how_sure_it_is_of_its_words_and_the_last_word() -> None:
    audio = np.concatenate(
        [speak("What is the weather like in Paris today", RATE), np.zeros(RATE // 10, np.float32)]
    )
    sure, plain = (
        FasterWhisperEngine(WhisperSettings(model="tiny.en", last_word_confidence=on, warmup=False))
        for on in (True, False)
    )
    sure.load()
    plain.load()
    (scored,) = sure.transcribe_batch([AsrInput(audio, "en")])
    (unscored,) = plain.transcribe_batch([AsrInput(audio, "en")])
    assert scored.text == unscored.text
    assert "today" in scored.text.lower()
    assert scored.last_word_logprob is not None and -0.5 < scored.last_word_logprob <= 0.0
    assert unscored.last_word_logprob is None
    # partials (the batcher's interruptible calls) keep no logits: no last-word score
    (partial,) = sure.transcribe_batch_until([AsrInput(audio, "en")], threading.Event())
    assert partial.text == scored.text
    assert partial.avg_logprob == pytest.approx(scored.avg_logprob, abs=SCORE_TOLERANCE)
    assert partial.last_word_logprob is None
    # the mean over the words comes either way; speech played backwards, heard as words
    # all the same, scores far lower (the gateway's VA_GATEWAY__END_OF_TURN_TRANSCRIPT_LOGPROB)
    assert scored.avg_logprob == pytest.approx(unscored.avg_logprob, abs=SCORE_TOLERANCE)
    assert unscored.avg_logprob is not None and -0.5 < unscored.avg_logprob <= 0.0
    # (a runaway loop, which backwards speech sometimes gives, is scored over the tokens
    # kept from the step logits: its confident repeats past the cap do not count)
    (backwards,) = sure.transcribe_batch([AsrInput(audio[::-1].copy(), "en")])
    assert backwards.avg_logprob is not None
    assert backwards.avg_logprob < scored.avg_logprob - 0.3  # far lower: -0.7 to -1.9 vs -0.16
    (silent,) = sure.transcribe_batch([AsrInput(np.zeros(RATE, np.float32), "en")])
    assert not any(c.isalnum() for c in silent.text)  # "" or "."
    assert silent.last_word_logprob is None
