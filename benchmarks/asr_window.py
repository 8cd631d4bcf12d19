"""tiny.en's word error rate and speed by encoder window (`VA_ASR__WHISPER__MIN_WINDOW_S`):
what the lite default's 10 s costs and what it saves against Whisper's own 30 s, and what
5 s would.

The sentences and voices of benchmarks/asr_multilingual.py (the real-speech tests' twelve,
espeak-ng and Piper, 16 kHz, 1.7–4.5 s), one utterance per model call on the streaming
doors' path (greedy, int8 on the CPU); each window runs the whole set three times and
keeps the fastest run (the text is the same every time: greedy decoding).

    .venv/bin/python -m benchmarks.asr_window --out benchmarks/results/asr_window_cpu_tiny_en.json
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from benchmarks.asr_multilingual import SENTENCES, VOICES, run, spoken
from services.asr.engines.whisper import FasterWhisperEngine
from services.asr.settings import WhisperSettings
from services.loadtest import report

WINDOWS_S = (5.0, 10.0, 30.0)
REPEATS = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    clips = {(v, s): spoken(s, v) for v in VOICES for s in SENTENCES}
    rows: list[dict[str, Any]] = []
    for window in WINDOWS_S:
        engine = FasterWhisperEngine(WhisperSettings(model="tiny.en", min_window_s=window))
        engine.load()
        runs = [run(engine, None, clips) for _ in range(REPEATS)]
        fastest = min(runs, key=lambda r: float(r["model_seconds"]))
        row = {"min_window_s": window, **fastest, "started": time.strftime("%H:%M:%S")}
        print(f"window {window:4.0f} s: WER {row['wer']:.3f} RTF {row['rtf']:.3f}", flush=True)
        rows.append(row)
    body = {
        "benchmark": "asr_window",
        "model": "tiny.en",
        "clips": len(clips),
        "repeats": REPEATS,
        "results": rows,
    }
    if args.out:
        report.write(args.out, body)


if __name__ == "__main__":
    main()
