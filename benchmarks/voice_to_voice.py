"""Voice-to-voice latency of the lite profile: last speech frame sent → first agent audio.

    python -m benchmarks.voice_to_voice --turns 10 --out benchmarks/results/voice_to_voice_lite.json

Starts Redis, ASR (pocketsphinx), TTS (espeak-ng) and the gateway as separate processes,
speaks espeak-ng sentences at real-time pace through /v1/stream (one session, one turn at
a time) and records per-turn timings from the client's side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.stack import lite_stack, machine
from services.common.client import StreamClient
from tests.speech import speak

SENTENCES = [
    "what is the weather like in paris today",
    "tell me a story about the sea",
    "how are you doing today",
    "how is the weather today",
]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


async def run_turns(url: str, turns: int) -> list[dict[str, Any]]:
    rows = []
    async with StreamClient(url) as client:
        for i in range(turns):
            sentence = SENTENCES[i % len(SENTENCES)]
            turn = client.new_turn()
            await client.speak(speak(sentence, 16000), 16000)
            await client.silence_until("response.done", timeout_s=30)
            sent = turn.last_speech_sent_at or 0.0

            def since(kind: str, sent: float = sent, turn: Any = turn) -> float | None:
                at = turn.time_of(kind)
                return None if at is None else round((at - sent) * 1000, 1)

            rows.append(
                {
                    "sentence": sentence,
                    "transcript": turn.of_type("transcript.final")[0]["text"],
                    "speech_stopped_ms": since("speech.stopped"),
                    "transcript_final_ms": since("transcript.final"),
                    "response_created_ms": since("response.created"),
                    "voice_to_voice_ms": round(turn.voice_to_voice_ms or -1, 1),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def summarize(rows: list[dict[str, Any]], key: str) -> dict[str, float]:
    values = [float(r[key]) for r in rows if r[key] is not None]
    return {
        "p50": round(statistics.median(values), 1),
        "p95": round(percentile(values, 95), 1),
        "min": round(min(values), 1),
        "max": round(max(values), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    started = time.time()
    with lite_stack() as urls:
        url = urls["gateway"].replace("http", "ws") + "/v1/stream"
        rows = asyncio.run(run_turns(url, args.turns))
    result = {
        "benchmark": "voice_to_voice",
        "profile": "lite (pocketsphinx + espeak-ng + silero VAD, echo agent)",
        "command": "python -m benchmarks.voice_to_voice " + " ".join(sys.argv[1:]),
        "machine": machine(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "settings": {"vad_min_silence_ms": 600, "output_lead_ms": 200},
        "summary": {
            key: summarize(rows, key)
            for key in ("speech_stopped_ms", "transcript_final_ms", "voice_to_voice_ms")
        },
        "turns": rows,
    }
    print(json.dumps(result["summary"], indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
