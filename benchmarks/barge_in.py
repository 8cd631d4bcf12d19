"""Barge-in time-to-silence on the lite profile: the user talks over the agent.

    python -m benchmarks.barge_in --trials 10 --out benchmarks/results/barge_in_lite.json

For each trial the agent starts a long reply; after a second of it the user speaks.
Time-to-silence is measured at the client, from `speech.started` arriving to the last
agent audio frame of the interrupted response arriving (the issue's definition uses
"sent"; received is later by the loopback hop, so this is conservative).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path
from typing import Any

from benchmarks.stack import lite_stack
from services.client.stream import StreamClient
from services.common.stats import summary
from services.loadtest.report import write
from tests.speech import speak

REPLY = (
    "Once upon a time there was a lighthouse keeper. Every night he climbed the stairs. "
    "He lit the great lamp and watched the ships. The sea was wide and dark and cold."
)


async def trial(url: str) -> dict[str, Any]:
    async with StreamClient(url) as client:
        turn = client.new_turn()
        await client.send({"type": "response.create", "text": REPLY})
        await client.wait_for("response.created", 10)
        await client.silence(1.0)
        await client.speak(speak("how is the weather today", 16000), 16000, lead_silence_ms=0)
        done = await client.wait_for("response.done", 10, lambda e: e["status"] == "cancelled")
        client.new_turn()
        await client.silence_until("response.done", 20)
    started_at = turn.time_of("speech.started") or 0.0
    return {
        "time_to_silence_ms": round(((turn.last_audio_at or started_at) - started_at) * 1000, 1),
        "clear_after_speech_started_ms": round(
            ((turn.time_of("output_audio.clear") or started_at) - started_at) * 1000, 1
        ),
        "heard": done["text"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = []
    with lite_stack() as urls:
        url = urls["gateway"].replace("http", "ws") + "/v1/stream"
        for _ in range(args.trials):
            rows.append(asyncio.run(trial(url)))
            print(json.dumps(rows[-1]), flush=True)
    result = {
        "benchmark": "barge_in",
        "profile": "lite (faster-whisper tiny.en + Piper joe + Silero VAD)",
        "end_of_turn": os.environ.get("VA_GATEWAY__END_OF_TURN", "auto"),
        "settings": {"min_speech_ms": 250, "barge_in_min_ms": 300, "output_lead_ms": 200},
        "summary": {"time_to_silence_ms": summary([r["time_to_silence_ms"] for r in rows])},
        "trials": rows,
    }
    print(json.dumps(result["summary"], indent=2))
    if args.out:
        write(args.out, result)


if __name__ == "__main__":
    main()
