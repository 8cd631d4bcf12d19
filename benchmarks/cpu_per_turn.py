"""CPU-seconds per turn, by service, on the default profile: what one spoken turn costs.

    python -m benchmarks.cpu_per_turn --turns 12 --out benchmarks/results/cpu_per_turn_lite.json

For each configuration (environment overrides of the default `make run` stack: ASR
tiny.en int8, Piper, Silero VAD and Smart Turn in the gateway, echo agent), starts Redis,
ASR, TTS and the gateway as separate processes, speaks 3–4 s requests at real-time pace
through /v1/stream one after the other, and reads each service's CPU time (user + system,
`/health` `process.cpu_seconds`) before and after: CPU time is counted by the kernel per
process, so other load on the machine changes it little (unlike wall-clock figures).
The voice-to-voice time of each turn is recorded beside it (from the end of the speech).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.stack import lite_stack
from benchmarks.voices import RATE, espeak
from services.client.stream import StreamClient
from services.common.stats import summary
from services.loadtest.report import write

REQUESTS = (
    "please call stella and ask her to bring these things with her",
    "what is the weather going to be like in paris tomorrow morning",
    "can you tell me how long it takes to drive to the airport",
    "remind me to buy milk and bread on my way home tonight",
    "how many people live in the largest city of australia",
    "turn off the lights in the kitchen and lock the front door",
)
VOICE = espeak("en-us", 150)
SERVICES = ("asr", "tts", "gateway")

CONFIGS: dict[str, dict[str, str]] = {
    "partials every 600 ms (before)": {"VA_GATEWAY__PARTIALS": "true"},
    "defaults": {},
    "defaults, 5 s encoder window": {"VA_ASR__WHISPER__MIN_WINDOW_S": "5"},
    "defaults, no prepared reply": {"VA_GATEWAY__PREPARE_REPLIES": "false"},
    "BLAS one thread per core (before)": {"VA_BLAS_THREADS": "0"},
}


async def speak_turns(url: str, turns: int) -> list[float]:
    """Speak `turns` requests, each after the previous answer ended; their v2v times."""
    times = []
    async with StreamClient(url) as client:
        for n in range(turns):
            turn = client.new_turn()
            await client.speak(VOICE(REQUESTS[n % len(REQUESTS)]), RATE)
            await client.silence_until("response.done", timeout_s=30)
            times.append(round(turn.voice_to_voice_ms or -1.0, 1))
    return times


def cpu_seconds(urls: dict[str, str]) -> dict[str, float]:
    return {
        name: float(httpx.get(f"{urls[name]}/health", timeout=10).json()["process"]["cpu_seconds"])
        for name in SERVICES
    }


def measure(env: dict[str, str], turns: int) -> dict[str, Any]:
    with lite_stack(env) as urls:
        url = urls["gateway"].replace("http", "ws") + "/v1/stream"
        asyncio.run(speak_turns(url, 1))  # warm-up: first-call allocations are not a turn's
        before = cpu_seconds(urls)
        v2v = asyncio.run(speak_turns(url, turns))
        after = cpu_seconds(urls)
        metrics = httpx.get(f"{urls['gateway']}/metrics", timeout=10).text
    per_turn = {name: round((after[name] - before[name]) / turns, 3) for name in SERVICES}
    return {
        "env": env,
        "turns": turns,
        "cpu_seconds_per_turn": {**per_turn, "total": round(sum(per_turn.values()), 3)},
        "voice_to_voice_ms": summary(v2v),
        "partials_asked": _counter(metrics, 'va_gateway_partials_total{outcome="asked"}'),
    }


def _counter(metrics: str, name: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(name):
            return float(line.split()[-1])
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--config", action="append", help="only these configurations")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    seconds = [VOICE(r).size / RATE for r in REQUESTS]
    rows = {}
    for name, env in CONFIGS.items():
        if args.config and name not in args.config:
            continue
        rows[name] = measure(env, args.turns)
        print(name, json.dumps(rows[name]), flush=True)
    result = {
        "benchmark": "cpu_per_turn",
        "profile": "lite (tiny.en int8, Piper joe, Silero VAD + Smart Turn, echo agent)",
        "utterance_s": {
            "min": round(min(seconds), 2),
            "mean": round(float(np.mean(seconds)), 2),
            "max": round(max(seconds), 2),
        },
        "configurations": rows,
    }
    if args.out:
        write(args.out, result)


if __name__ == "__main__":
    main()
