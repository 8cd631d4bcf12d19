"""Cross-session batching for faster-whisper: batched vs one at a time, through the Batcher.

    python -m benchmarks.asr_batching --out benchmarks/results/asr_batching_cpu_tiny.json
    python -m benchmarks.asr_batching --device cuda --random-size large-v3-turbo \\
        --out benchmarks/results/asr_batching_gpu_turbo_random.json
    python -m benchmarks.asr_batching --device cuda --model models/faster-whisper-large-v3-turbo
    python -m benchmarks.asr_batching --model tiny.en --speech --concurrency 1,4,8,16 \\
        --out benchmarks/results/asr_batching_cpu_tiny_en_speech.json

At each concurrency C, C clients each send utterances back to back (a closed loop)
until `--utterances` (default 4 × C, at least 16) have been transcribed (after an
untimed pass; each mode's reported pass is the median of `--repeats`); latency is
from entering the batcher to the transcript. "batched" lets the batcher take up to
`--max-batch` waiting utterances per model call (default: C); "one_at_a_time" is
the same batcher with max_batch=1. Without `--model` a random-weight Whisper is built
(tiny by default; `--random-size large-v3-turbo` is real size: ~1.6 GB, minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from services.asr.batcher import Batcher
from services.asr.engines.base import AsrInput
from services.asr.engines.whisper import FasterWhisperEngine
from services.asr.settings import WhisperSettings
from services.common.stats import percentile
from services.loadtest.report import versions, write

RATE = 16000


def spoken(count: int, seed: int = 0) -> list[AsrInput]:
    """The load test's sentences (1.5 to 4 s each) in espeak-ng voices at 150-200 wpm."""
    from services.loadtest.corpus import SENTENCES
    from tests.speech import speak

    rng = np.random.default_rng(seed)
    found = []
    for i in range(count):
        text = SENTENCES[int(rng.integers(len(SENTENCES)))]
        wpm = int(rng.choice([150, 170, 190]))
        found.append(AsrInput(speak(text, RATE, "en-us" if i % 3 else "en-gb", wpm), "en"))
    return found


def utterances(count: int, seed: int = 0) -> list[AsrInput]:
    """Noise and tones of 1 to 4 s, a language hint on half of them."""
    rng = np.random.default_rng(seed)
    found = []
    for i in range(count):
        seconds = float(rng.uniform(1.0, 4.0))
        n = int(RATE * seconds)
        if i % 2:
            audio = rng.standard_normal(n) * 0.1
        else:
            audio = 0.3 * np.sin(2 * np.pi * rng.uniform(150, 3000) * np.arange(n) / RATE)
        found.append(AsrInput(audio.astype(np.float32), "en" if i % 4 < 2 else None))
    return found


async def run_level(
    engine: FasterWhisperEngine, concurrency: int, max_batch: int, items: list[AsrInput]
) -> dict[str, Any]:
    batcher = Batcher(engine, max_batch=max_batch, max_queue=100_000)
    runner = asyncio.create_task(batcher.run())
    latencies: list[float] = []
    queue = list(reversed(items))

    async def client() -> None:
        while queue:
            item = queue.pop()
            started = time.perf_counter()
            await batcher.transcribe(item)
            latencies.append(time.perf_counter() - started)

    began = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = time.perf_counter() - began
    runner.cancel()
    await asyncio.gather(runner, return_exceptions=True)
    return {
        "concurrency": concurrency,
        "max_batch": max_batch,
        "utterances": len(items),
        "seconds": round(elapsed, 3),
        "utterances_per_s": round(len(items) / elapsed, 2),
        "latency_p50_ms": round(1000 * percentile(latencies, 50), 1),
        "latency_p95_ms": round(1000 * percentile(latencies, 95), 1),
        "latency_mean_ms": round(1000 * statistics.fmean(latencies), 1),
        "model_calls": batcher.batches_run,
        "mean_batch": round(len(items) / max(1, batcher.batches_run), 2),
    }


def load_engine(args: argparse.Namespace, workdir: Path) -> tuple[FasterWhisperEngine, str]:
    if args.model == "tiny.en":
        from services.asr.engines.catalog import TINY_EN

        folder = TINY_EN.verify()
        described = f"Whisper tiny.en, real weights ({TINY_EN.distribution}=={TINY_EN.version})"
    elif args.model:
        folder, described = Path(args.model), args.model
    else:
        from tests.tiny_whisper import LARGE_V3_TURBO, TINY, build_tiny_whisper

        dims = LARGE_V3_TURBO if args.random_size == "large-v3-turbo" else TINY
        started = time.perf_counter()
        folder = build_tiny_whisper(workdir / "random-whisper", dims=dims)
        described = (
            f"random-weight Whisper, {args.random_size} size (tests/tiny_whisper.py), "
            f"built in {time.perf_counter() - started:.1f} s"
        )
    settings = WhisperSettings(
        model=str(folder),
        device=args.device,
        compute_type=args.compute_type,
        cpu_threads=args.cpu_threads,
    )
    engine = FasterWhisperEngine(settings)
    engine.load()  # includes the warm-up
    return engine, described


async def measure(args: argparse.Namespace, engine: FasterWhisperEngine) -> list[dict[str, Any]]:
    """Per level: one untimed pass of each mode, then `repeats` alternating timed passes;
    each mode's row is its median-throughput pass (all throughputs kept)."""
    rows = []
    for concurrency in args.concurrency:
        count = args.utterances or max(16, 4 * concurrency)
        items = (spoken if args.speech else utterances)(count, seed=concurrency)
        modes = {"one_at_a_time": 1, "batched": args.max_batch or concurrency}
        for max_batch in modes.values():
            await run_level(engine, concurrency, max_batch, items[: max(concurrency, 4)])
        passes: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
        for repeat in range(args.repeats):
            order = list(modes) if repeat % 2 == 0 else list(reversed(modes))
            for mode in order:
                passes[mode].append(await run_level(engine, concurrency, modes[mode], items))
        for mode, done in passes.items():
            ranked = sorted(done, key=lambda r: r["utterances_per_s"])
            row = {
                "mode": mode,
                **ranked[len(ranked) // 2],
                "utterances_per_s_all": [r["utterances_per_s"] for r in done],
            }
            print(
                f"C={concurrency:3} {mode:14} {row['utterances_per_s']:8.2f} utt/s  "
                f"p50 {row['latency_p50_ms']:8.1f} ms  p95 {row['latency_p95_ms']:8.1f} ms  "
                f"mean batch {row['mean_batch']}",
                flush=True,
            )
            rows.append(row)
    return rows


def speedups(rows: list[dict[str, Any]]) -> dict[str, float]:
    by = {(r["concurrency"], r["mode"]): r["utterances_per_s"] for r in rows}
    levels = sorted({r["concurrency"] for r in rows})
    return {
        str(c): round(by[(c, "batched")] / by[(c, "one_at_a_time")], 2)
        for c in levels
        if by.get((c, "one_at_a_time"))
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model", help="a CTranslate2 Whisper folder, or tiny.en (default: build a random one)"
    )
    parser.add_argument(
        "--speech", action="store_true", help="espeak-ng sentences instead of noise and tones"
    )
    parser.add_argument(
        "--random-size",
        choices=("tiny", "large-v3-turbo"),
        default="tiny",
        help="size of the random-weight model built without --model",
    )
    parser.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu")
    parser.add_argument("--compute-type", default="default")
    parser.add_argument(
        "--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32]
    )
    parser.add_argument("--utterances", type=int, default=0, help="per level (0: 4 × C, ≥ 16)")
    parser.add_argument("--max-batch", type=int, default=0, help="batched mode (0: C)")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per mode and level")
    parser.add_argument("--cpu-threads", type=int, default=0, help="CTranslate2 CPU threads")
    parser.add_argument("--out", type=Path, help="where to write the JSON results")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="asr-bench-") as workdir:
        engine, described = load_engine(args, Path(workdir))
        rows = asyncio.run(measure(args, engine))
    body = {
        "benchmark": "asr_batching",
        "model": described,
        "audio": "espeak-ng sentences, 1.5-4 s" if args.speech else "noise and tones, 1-4 s",
        "device": engine.device,
        "compute_type": args.compute_type,
        "cpu_threads": args.cpu_threads,
        "repeats": args.repeats,
        "versions": versions("ctranslate2", "faster-whisper", "numpy"),
        "results": rows,
        "batched_speedup": speedups(rows),
    }
    print("batched / one at a time:", body["batched_speedup"])
    if args.out:
        write(args.out, body)


if __name__ == "__main__":
    main()
