"""tiny.en's word error rate and speed by encoder window (`VA_ASR__WHISPER__MIN_WINDOW_S`):
what the lite default's 10 s costs and what it saves against Whisper's own 30 s, and what
5 s would.

Two sets, one utterance per model call on the streaming doors' path (greedy, int8 on the
CPU), 16 kHz:
- `chosen_on`: the real-speech tests' twelve sentences in espeak-ng and Piper
  (benchmarks/asr_multilingual.py), the kind of set the 10 s default was picked on;
- `held_out`: the turn-taking benchmark's held-out sentences, whole, in its held-out voices
  (benchmarks/turn_taking.py: a Scottish accent, a slow en-us, Piper at 0.85 and 1.0),
  which no window was chosen with.
Each window runs each set three times and keeps the fastest run (greedy decoding gives
the same text every time).

    .venv/bin/python -m benchmarks.asr_window --out benchmarks/results/asr_window_cpu_tiny_en.json
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import jiwer
import numpy as np
import numpy.typing as npt

from benchmarks import asr_multilingual, turn_taking
from services.asr.engines.base import AsrInput
from services.asr.engines.whisper import FasterWhisperEngine
from services.asr.settings import WhisperSettings
from services.loadtest import report
from services.loadtest.stats import words

WINDOWS_S = (5.0, 10.0, 30.0)
REPEATS = 3
Clips = dict[str, tuple[str, npt.NDArray[np.float32]]]
"""A name → (the sentence said, its audio)."""


def chosen_on() -> Clips:
    return {
        f"{voice}: {sentence}": (sentence, asr_multilingual.spoken(sentence, voice))
        for voice in asr_multilingual.VOICES
        for sentence in asr_multilingual.SENTENCES
    }


def held_out() -> Clips:
    voices = {**turn_taking.HELD_OUT_ESPEAK, **turn_taking.HELD_OUT_PIPER}
    return {
        f"{name}: {sentence}": (sentence, say(sentence))
        for name, say in voices.items()
        for sentence, _, _ in turn_taking.HELD_OUT
    }


def measure(engine: FasterWhisperEngine, clips: Clips) -> dict[str, Any]:
    """WER over the set and the real-time factor of the fastest of `REPEATS` runs."""
    best_s, heard = float("inf"), {}
    for _ in range(REPEATS):
        started = time.perf_counter()
        heard = {
            name: engine.transcribe_batch([AsrInput(audio)])[0].text
            for name, (_, audio) in clips.items()
        }
        best_s = min(best_s, time.perf_counter() - started)
    audio_s = sum(audio.size for _, audio in clips.values()) / 16000
    said = [words(sentence) for sentence, _ in clips.values()]
    return {
        "clips": len(clips),
        "wer": round(float(jiwer.wer(said, [words(heard[name]) for name in clips])), 4),
        "rtf": round(best_s / audio_s, 4),
        "misheard": {n: heard[n] for n, (s, _) in clips.items() if words(heard[n]) != words(s)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    sets = {"chosen_on": chosen_on(), "held_out": held_out()}
    rows: list[dict[str, Any]] = []
    for window in WINDOWS_S:
        engine = FasterWhisperEngine(WhisperSettings(model="tiny.en", min_window_s=window))
        engine.load()
        row: dict[str, Any] = {"min_window_s": window}
        for name, clips in sets.items():
            row[name] = measure(engine, clips)
            print(
                f"window {window:4.0f} s, {name}: WER {row[name]['wer']:.3f} "
                f"RTF {row[name]['rtf']:.3f}",
                flush=True,
            )
        rows.append(row)
    body = {"benchmark": "asr_window", "model": "tiny.en", "repeats": REPEATS, "results": rows}
    if args.out:
        report.write(args.out, body)


if __name__ == "__main__":
    main()
