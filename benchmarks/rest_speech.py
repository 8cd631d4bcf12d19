"""First byte of `POST /v1/audio/speech` by response format, the same text each time.

A real TTS service (Piper, the lite default) on a free port, with its own Redis; each
round asks for the same three sentences in every format, one after the other, and times
the first body byte at the client (httpx, streaming), then hangs up (the service stops
synthesizing). A first round also reads every body whole. Every format is encoded chunk
by chunk as the engine makes audio (services/common/audio/stream_encoder.py), so a
compressed format's first byte should come within a few ms of `pcm`'s: the target is
`mp3` within 30 ms of `pcm`. On a shared machine the synthesis time itself swings by
hundreds of ms from one request to the next, so the gap is also taken per round (each
format against the `pcm` request just before it) and its median reported, beside what
the encoder itself costs for the first 200 ms chunk (timed in-process).

    .venv/bin/python -m benchmarks.rest_speech --out benchmarks/results/rest_speech_piper_cpu.json
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from services.common.stats import summary
from services.loadtest import report
from services.ops.redis_server import free_port, start_redis
from services.tts.app import create_app
from services.tts.settings import TtsSettings
from tests.servers import ServerThread

TEXT = (
    "Thanks for calling, your table for two is booked for seven tonight. "
    "We will send a reminder an hour before. Is there anything else I can help with?"
)
FORMATS = ("pcm", "mp3", "opus", "aac", "flac", "wav")
TARGET_MS = 30.0


def one(client: httpx.Client, url: str, fmt: str, whole: bool) -> tuple[float, float, int]:
    """(first byte ms, whole body ms or 0, bytes read) of one request."""
    body = {"model": "tts-1", "voice": "alloy", "input": TEXT, "response_format": fmt}
    started = time.perf_counter()
    first = 0.0
    size = 0
    with client.stream("POST", url, json=body) as response:
        response.raise_for_status()
        for chunk in response.iter_raw():
            if chunk and not size:
                first = time.perf_counter() - started
            size += len(chunk)
            if size and not whole:
                break
    return 1000 * first, 1000 * (time.perf_counter() - started) if whole else 0.0, size


def encoder_cost_ms(fmt: str, repeats: int = 50) -> float:
    """The median time to open the encoder and encode a first 200 ms chunk (24 kHz)."""
    import numpy as np

    from services.common.audio.stream_encoder import StreamEncoder

    chunk = (0.1 * np.sin(np.arange(4800, dtype=np.float32) / 10)).astype(np.float32)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        encoder = StreamEncoder(fmt, 24000)
        encoder.start()
        encoder.encode(chunk)
        times.append(1000 * (time.perf_counter() - started))
        encoder.close()
    return summary(times)["p50"]


def measure(base: str, rounds: int) -> dict[str, dict[str, Any]]:
    url = f"{base}/v1/audio/speech"
    firsts: dict[str, list[float]] = {fmt: [] for fmt in FORMATS}
    gaps: dict[str, list[float]] = {fmt: [] for fmt in FORMATS}
    wholes: dict[str, float] = {}
    sizes: dict[str, int] = {}
    with httpx.Client(timeout=60) as client:
        for fmt in FORMATS:  # warm-up, each body read whole
            _, wholes[fmt], sizes[fmt] = one(client, url, fmt, whole=True)
        for _ in range(rounds):
            pcm = 0.0
            for fmt in FORMATS:  # pcm first: each format is paired with the pcm before it
                first, _, _ = one(client, url, fmt, whole=False)
                pcm = first if fmt == "pcm" else pcm
                firsts[fmt].append(first)
                gaps[fmt].append(first - pcm)
    return {
        fmt: {
            "first_byte_ms": summary(firsts[fmt]),
            "minus_pcm_same_round_ms": summary(gaps[fmt]),
            "encoder_first_chunk_ms": round(encoder_cost_ms(fmt), 2),
            "whole_ms_once": round(wholes[fmt], 1),
            "bytes": sizes[fmt],
        }
        for fmt in FORMATS
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--out", type=Path, help="where to write the JSON results")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rest-speech-") as workdir:
        port = free_port()
        redis = start_redis(port, Path(workdir))
        try:
            settings = TtsSettings.model_validate(
                {
                    "profile": "lite",
                    "redis": {"url": f"redis://127.0.0.1:{port}/0"},
                    "auth": {"required": False},  # a local benchmark: no keys to make
                }
            )
            with ServerThread(create_app(settings)) as server:
                rows = measure(server.http, args.rounds)
        finally:
            redis.terminate()
            redis.wait(10)
    gap = rows["mp3"]["minus_pcm_same_round_ms"]["p50"]
    body = {
        "benchmark": "rest_speech",
        "engine": "piper (joe, lite default)",
        "text_chars": len(TEXT),
        "rounds": args.rounds,
        "formats": rows,
        "mp3_minus_pcm_first_byte_ms": {
            "median_of_same_round_gaps": round(gap, 1),
            "difference_of_p50s": round(
                rows["mp3"]["first_byte_ms"]["p50"] - rows["pcm"]["first_byte_ms"]["p50"], 1
            ),
        },
        "target_ms": TARGET_MS,
        "target_met": gap <= TARGET_MS,
    }
    for fmt, row in rows.items():
        print(
            f"{fmt:5} first byte {row['first_byte_ms']}  minus pcm "
            f"{row['minus_pcm_same_round_ms']}  encoder {row['encoder_first_chunk_ms']} ms"
        )
    print(f"mp3 - pcm first byte (median same-round gap): {gap:.1f} ms (target <= {TARGET_MS})")
    if args.out:
        report.write(args.out, body)


if __name__ == "__main__":
    main()
