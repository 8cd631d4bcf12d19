"""The engine benchmarks run (smallest settings) and their GPU-only helpers hold together."""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from benchmarks import asr_batching, chatterbox_random, tts_stream
from services.asr.engines.whisper import FasterWhisperEngine
from services.asr.settings import WhisperSettings
from services.common.stats import percentile
from services.loadtest import report
from tests.tiny_whisper import build_tiny_whisper


async def test_asr_levels_compare_batched_and_single(tmp_path: Path) -> None:
    engine = FasterWhisperEngine(
        WhisperSettings(model=str(build_tiny_whisper(tmp_path / "m")), device="cpu")
    )
    engine.load()
    args = argparse.Namespace(concurrency=[4], utterances=8, max_batch=0, repeats=1, speech=False)
    rows = await asr_batching.measure(args, engine)
    assert [(r["mode"], r["max_batch"]) for r in rows] == [("one_at_a_time", 1), ("batched", 4)]
    single, batched = rows
    assert single["model_calls"] == 8
    assert batched["model_calls"] < 8
    assert set(asr_batching.speedups(rows)) == {"4"}


async def test_tts_levels_report_first_audio_and_rtf() -> None:
    args = argparse.Namespace(
        concurrency=[1, 2], rounds=1, max_concurrent=0, chunk_ms=200, sample_rate=24000
    )
    engine, voice, _ = tts_stream.espeak_engine(args)
    rows = await tts_stream.measure(engine, voice, args)
    assert [r["syntheses"] for r in rows] == [1, 2]
    for row in rows:
        assert 0 < row["ttfa_p50_ms"] <= row["ttfa_p95_ms"]
        assert 0 < row["rtf_p50"] < 1


def test_character_tokenizer_fits_chatterbox(tmp_path: Path) -> None:
    path = chatterbox_random.character_tokenizer(tmp_path / "tokenizer.json", 704)
    tokenizer = Tokenizer.from_file(str(path))
    vocab = tokenizer.get_vocab()
    assert {"[START]", "[STOP]", "[SPACE]", "[UNK]"} <= set(vocab)
    assert max(vocab.values()) < 704  # T3's text vocabulary
    ids = tokenizer.encode("Hello,[SPACE]world!").ids
    assert ids[5] == vocab[","] and ids[6] == vocab["[SPACE]"] and len(ids) == 13


def test_report_records_the_command_and_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.argv", ["asr_batching.py", "--concurrency", "1"])
    out = tmp_path / "r.json"
    report.write(out, {"benchmark": "x", "results": []})
    body = json.loads(out.read_text())
    assert body["command"].endswith("--concurrency 1")
    assert body["machine"]["cores"] >= 1 and body["machine"]["cpu"]
    assert body["timestamp"].endswith("Z")
    assert percentile([5.0, 1.0, 3.0], 50) == 3.0
    assert percentile([float(v) for v in range(1, 101)], 7) == 7.0  # no float noise
    assert percentile([], 50) == 0.0


def test_summary_is_nearest_rank_and_rounded() -> None:
    from services.common.stats import summary

    values = [float(v) for v in range(1, 21)]  # 1..20
    # nearest rank: p50 → rank ceil(0.5 × 20) = 10 → 10; p95 → rank ceil(0.95 × 20) = 19 → 19
    assert summary(values) == {"p50": 10.0, "p95": 19.0, "min": 1.0, "max": 20.0}
    assert summary([3.14159]) == {"p50": 3.1, "p95": 3.1, "min": 3.1, "max": 3.1}


async def test_turn_decisions_replay_the_policy_on_recorded_pauses() -> None:
    """A fragment misheard as finished, with a sure model: answered unless the ASR's doubt
    is read; a pause shorter than the transcript's arrival ends nothing; the silence
    policy answers every fragment at 600 ms."""
    import numpy as np

    from benchmarks.turn_decisions import Framed, Pause, replay
    from benchmarks.turn_taking import Utterance
    from services.gateway.turn_end import Heard

    def pause(heard: Heard, silence_ms: int, began_ms: int) -> Pause:
        grid = [s for s in (100, 300, 500, 700, 900, 1100) if s <= silence_ms]
        asks = [(s, 16000 + 16 * s) for s in grid]
        return Pause(np.zeros(0, np.float32), silence_ms, asks, heard, [0.95] * len(asks), began_ms)

    clip = np.zeros(0, np.float32)
    fragment = Utterance("Please remind me to call.", "v", False, clip, clip, "Please remind me to")
    whole = Utterance("Please remind me.", "v", True, clip, None, "Please remind me.")
    misheard = Heard("Please remind me", avg_logprob=-0.76)
    framed = [
        # a 200 ms pause inside the sentence, then the fragment's end
        Framed(fragment, 500, [pause(Heard("Please"), 200, 900), pause(misheard, 2000, 1500)]),
        # the VAD heard the silence begin 40 ms after the voice ended
        Framed(whole, 500, [pause(Heard("Please remind me.", avg_logprob=-0.1), 2000, 1540)], 1500),
    ]
    doubting = {"end_of_turn_transcript_logprob": -0.5, "end_of_turn_doubt_ms": 1100}
    read = await replay(framed, doubting, gap_ms=1000, heard_at_ms=250, model_ms=70)
    unread = await replay(framed, {"end_of_turn_transcript_logprob": None}, 1000, 250, 70)
    silence = await replay(framed, {"silence": True}, 1000, 250, 70)
    assert (read["false_cut_offs"], unread["false_cut_offs"], silence["false_cut_offs"]) == (
        0,
        1,
        1,
    )
    assert unread["cut_offs"][0]["pause"] == "2 of 2"  # not the 200 ms pause: too short
    assert unread["cut_offs"][0]["ended_at_silence_ms"] == 250  # when the words came
    assert unread["cut_offs"][0]["why"] == "model"
    # the words, then the model asked at the first ask (100 + 70 ms < 250 ms)
    assert read["decision_ms"]["p50"] == 40 + 250
    assert read["complete_ended_by"] == {"model": 1}
    assert silence["decision_ms"]["p50"] == 40 + 600


def test_the_labelled_sets_held_out_part_shares_no_sentence_and_has_voices_of_its_own() -> None:
    from benchmarks.turn_taking import (
        ESPEAK,
        HELD_OUT,
        HELD_OUT_ESPEAK,
        HELD_OUT_PIPER,
        PIPER,
        SET,
        TUNING_MORE,
    )

    tuning = SET + TUNING_MORE
    assert not {s for s, _, _ in tuning} & {s for s, _, _ in HELD_OUT}
    # each sentence whole and cut, in two voices
    assert 4 * (len(tuning) + len(HELD_OUT)) >= 120
    tuning_voices, held_out_voices = {*ESPEAK, *PIPER}, {*HELD_OUT_ESPEAK, *HELD_OUT_PIPER}
    assert len(held_out_voices - tuning_voices) >= 2
    assert len(tuning_voices | held_out_voices) >= 6
    for sentence, word, _ in tuning + HELD_OUT:
        assert f" {word}" in sentence  # where the cut falls


def test_the_long_sentences_held_out_part_is_its_own() -> None:
    """The long parts (pauses inside a sentence): no sentence or voice of the held-out one
    is in the other, and every sentence has the commas it is there for."""
    from benchmarks.turn_taking import (
        LONG,
        LONG_ESPEAK,
        LONG_HELD_OUT,
        LONG_HELD_OUT_ESPEAK,
        LONG_HELD_OUT_PIPER,
        LONG_PIPER,
    )

    assert not set(LONG) & set(LONG_HELD_OUT)
    assert not {*LONG_ESPEAK, *LONG_PIPER} & {*LONG_HELD_OUT_ESPEAK, *LONG_HELD_OUT_PIPER}
    assert all(sentence.count(",") >= 1 for sentence in LONG + LONG_HELD_OUT)


def test_the_turn_models_decisions_are_read_from_metrics() -> None:
    from benchmarks.turn_taking import _turn_model_counts

    text = (
        "# HELP va_gateway_turn_model_total Decisions.\n"
        "# TYPE va_gateway_turn_model_total counter\n"
        'va_gateway_turn_model_total{decision="complete"} 3.0\n'
        'va_gateway_turn_model_total{decision="unsure_ended"} 1.0\n'
        'va_gateway_other_total{decision="complete"} 9.0\n'
    )
    assert _turn_model_counts(text) == {"complete": 3.0, "unsure_ended": 1.0}


BENCHMARKS = sorted(
    path.stem for path in Path("benchmarks").glob("*.py") if path.stem != "__init__"
)


@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmark_imports(name: str) -> None:
    """mypy reads services/ only: a benchmark left behind by a move fails here, not when
    someone next measures with it. A missing optional extra (torch for the duplex ones)
    is that environment's, not the benchmark's."""
    try:
        importlib.import_module(f"benchmarks.{name}")
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] in {"benchmarks", "services", "tests"}:
            raise
        pytest.skip(f"needs {exc.name}")
