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
import os
from pathlib import Path
from typing import Any

from benchmarks.report import summary, write
from benchmarks.stack import lite_stack
from services.client.stream import StreamClient
from tests.speech import speak

SENTENCES = [
    "what is the weather like in paris today",
    "tell me a story about the sea",
    "how are you doing today",
    "how is the weather today",
]


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with lite_stack() as urls:
        url = urls["gateway"].replace("http", "ws") + "/v1/stream"
        rows = asyncio.run(run_turns(url, args.turns))
    keys = ("speech_stopped_ms", "transcript_final_ms", "voice_to_voice_ms")
    result = {
        "benchmark": "voice_to_voice",
        "profile": "lite (pocketsphinx + espeak-ng + silero VAD, echo agent)",
        "settings": {
            "vad_min_silence_ms": 600,
            "output_lead_ms": 200,
            "partial_interval_ms": int(os.environ.get("VA_GATEWAY__PARTIAL_INTERVAL_MS", "600")),
        },
        "summary": {
            key: summary([float(r[key]) for r in rows if r[key] is not None]) for key in keys
        },
        "turns": rows,
    }
    print(json.dumps(result["summary"], indent=2))
    if args.out:
        write(args.out, result)


if __name__ == "__main__":
    main()
