"""Word error rate and real-time factor of the multilingual Whisper base beside tiny.en.

The English sentences of the real-speech tests (tests/e2e/test_real_speech.py: the first
twelve of the load-test corpus, each spoken by espeak-ng and by the Piper voice), 16 kHz,
one utterance per model call on the path the streaming doors use (the batched,
timestamp-free decode, greedy, int8 on the CPU, the service's default settings). `base`
runs twice: detecting the language of every utterance (what a session with no language
gets) and told it is English. Real-time factor: model time / audio time, whole set.

    .venv/bin/python -m benchmarks.asr_multilingual \\
        --out benchmarks/results/asr_multilingual_cpu.json
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import jiwer
import numpy as np
import numpy.typing as npt

from services.asr.engines.base import AsrInput
from services.asr.engines.whisper import FasterWhisperEngine
from services.asr.settings import WhisperSettings
from services.loadtest import report
from services.loadtest.corpus import SENTENCES as CORPUS
from services.loadtest.stats import words
from tests.speech import piper_speech, speak

SENTENCES = CORPUS[:12]
VOICES = ("espeak", "piper")
RUNS = (("tiny.en", None), ("base", None), ("base", "en"))
"""(model, the language it is told; None: it detects it)."""


def spoken(text: str, voice: str) -> npt.NDArray[np.float32]:
    if voice == "espeak":
        return speak(text, 16000)
    return piper_speech(text)


def run(
    engine: FasterWhisperEngine, language: str | None, clips: dict[tuple[str, str], Any]
) -> dict[str, Any]:
    heard: dict[tuple[str, str], tuple[str, str | None]] = {}
    model_s = audio_s = 0.0
    for key, audio in clips.items():
        started = time.perf_counter()
        (result,) = engine.transcribe_batch([AsrInput(audio, language)])
        model_s += time.perf_counter() - started
        audio_s += audio.size / 16000
        heard[key] = (result.text, result.language)
    by_voice = {}
    for voice in VOICES:
        references = [words(s) for s in SENTENCES]
        hypotheses = [words(heard[(voice, s)][0]) for s in SENTENCES]
        by_voice[voice] = round(float(jiwer.wer(references, hypotheses)), 4)
    every = [words(s) for _ in VOICES for s in SENTENCES]
    hypotheses = [words(heard[(v, s)][0]) for v in VOICES for s in SENTENCES]
    languages = [heard[k][1] for k in clips]
    return {
        "wer": round(float(jiwer.wer(every, hypotheses)), 4),
        "wer_by_voice": by_voice,
        "rtf": round(model_s / audio_s, 4),
        "model_seconds": round(model_s, 2),
        "audio_seconds": round(audio_s, 2),
        "heard_as_english": f"{sum(lang == 'en' for lang in languages)}/{len(languages)}",
        "misheard": {
            f"{v}: {s}": heard[(v, s)][0]
            for v in VOICES
            for s in SENTENCES
            if words(heard[(v, s)][0]) != words(s)
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="where to write the JSON results")
    args = parser.parse_args()
    clips = {(v, s): spoken(s, v) for v in VOICES for s in SENTENCES}
    rows = []
    with tempfile.TemporaryDirectory(prefix="asr-multilingual-") as models_dir:
        engines: dict[str, FasterWhisperEngine] = {}
        for model, language in RUNS:
            if model not in engines:
                started = time.perf_counter()
                engines[model] = FasterWhisperEngine(
                    WhisperSettings(model=model, models_dir=Path(models_dir))
                )
                engines[model].load()
                load_s = time.perf_counter() - started
            told = language or ("detected" if model == "base" else "English-only model")
            row = {"model": model, "language": told, "load_s": round(load_s, 2)}
            row |= run(engines[model], language, clips)
            print(
                f"{model:8} {row['language']:18} WER {row['wer']:.3f} {row['wer_by_voice']} "
                f"RTF {row['rtf']:.3f} English {row['heard_as_english']}"
            )
            rows.append(row)
    body = {
        "benchmark": "asr_multilingual",
        "clips": len(clips),
        "sentences": SENTENCES,
        "settings": "faster-whisper int8 on CPU, greedy, min_window_s 10 (service defaults)",
        "results": rows,
    }
    if args.out:
        report.write(args.out, body)


if __name__ == "__main__":
    main()
