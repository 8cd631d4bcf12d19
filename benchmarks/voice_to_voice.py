"""Voice-to-voice on the default profile: latency, what the ASR heard, how clear the reply is.

    VA_GATEWAY__END_OF_TURN=silence python -m benchmarks.voice_to_voice --turns 6 \\
        --out benchmarks/results/voice_to_voice_lite_silence.json
    python -m benchmarks.voice_to_voice --turns 6 --out benchmarks/results/voice_to_voice_lite.json

Starts Redis, ASR (faster-whisper tiny.en), TTS (Piper) and the gateway as separate
processes (`voice-agent up`'s layout), then speaks the load test's requests at real-time
pace through /v1/stream, one session, one turn at a time, in several voices: espeak-ng
(en-us at 160 and 190 words per minute, en-gb) and Piper (joe at speed 1.0 and 1.2).
Per turn, from the client's side: the stages up to the first agent audio; the transcript
(word error rate against the script); and the echo agent's spoken reply transcribed
again by the ASR service (the share of its words recovered: reply intelligibility).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path
from typing import Any

import jiwer

from benchmarks.stack import lite_stack
from benchmarks.voices import Voice, espeak, piper
from services.client.stream import StreamClient
from services.common.audio.pcm import pcm16_to_float
from services.common.stats import summary
from services.loadtest.corpus import SENTENCES
from services.loadtest.report import write
from services.loadtest.stats import words
from tests.speech import transcribed

VOICES: dict[str, Voice] = {
    "espeak en-us 160 wpm": espeak("en-us", 160),
    "espeak en-us 190 wpm": espeak("en-us", 190),
    "espeak en-gb 150 wpm": espeak("en-gb", 150),
    "piper joe 1.0": piper(1.0),
    "piper joe 1.2": piper(1.2),
}


async def run_turns(url: str, voice: str, sentences: list[str]) -> list[dict[str, Any]]:
    rows = []
    async with StreamClient(url) as client:
        for sentence in sentences:
            turn = client.new_turn()
            await client.speak(VOICES[voice](sentence), 16000)
            await client.silence_until("response.done", timeout_s=30)
            since = turn.ms_after_speech
            rows.append(
                {
                    "voice": voice,
                    "sentence": sentence,
                    "transcript": turn.of_type("transcript.final")[0]["text"],
                    "speech_stopped_ms": since("speech.stopped"),
                    "transcript_final_ms": since("transcript.final"),
                    "response_created_ms": since("response.created"),
                    "voice_to_voice_ms": round(turn.voice_to_voice_ms or -1, 1),
                    "reply": bytes(turn.audio),
                }
            )
    return rows


def reply_heard(asr_url: str, row: dict[str, Any]) -> str:
    """The agent's spoken reply (24 kHz PCM16), transcribed by the ASR service."""
    return transcribed(asr_url, pcm16_to_float(row.pop("reply")), 24000)


def error_rate(rows: list[dict[str, Any]], said: str, heard: str) -> float:
    return round(
        float(jiwer.wer([words(r[said]) for r in rows], [words(r[heard]) for r in rows])), 4
    )


def recovered(rows: list[dict[str, Any]]) -> float:
    """Share of the reply's words the second transcription gives back (hits / reference)."""
    out = jiwer.process_words(
        [words(r["transcript"]) for r in rows], [words(r["reply_heard"]) for r in rows]
    )
    return round(out.hits / max(1, out.hits + out.substitutions + out.deletions), 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=10, help="turns per voice")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    sentences = [SENTENCES[i % len(SENTENCES)] for i in range(args.turns)]
    rows: list[dict[str, Any]] = []
    with lite_stack() as urls:
        url = urls["gateway"].replace("http", "ws") + "/v1/stream"
        for voice in VOICES:
            rows += asyncio.run(run_turns(url, voice, sentences))
        for row in rows:
            row["reply_heard"] = reply_heard(urls["asr"], row)
            print(json.dumps(row), flush=True)
    keys = ("speech_stopped_ms", "transcript_final_ms", "voice_to_voice_ms")
    by_voice = {voice: [r for r in rows if r["voice"] == voice] for voice in VOICES}
    result = {
        "benchmark": "voice_to_voice",
        "profile": "lite (faster-whisper tiny.en int8 + Piper joe + Silero VAD, echo agent)",
        "settings": {
            "end_of_turn": os.environ.get("VA_GATEWAY__END_OF_TURN", "auto"),
            "speculative_asr": os.environ.get("VA_GATEWAY__SPECULATIVE_ASR", "true"),
            "vad_min_silence_ms": 600,
            "output_lead_ms": 200,
            "partial_interval_ms": int(os.environ.get("VA_GATEWAY__PARTIAL_INTERVAL_MS", "600")),
        },
        "summary": {
            **{key: summary([float(r[key]) for r in rows if r[key] is not None]) for key in keys},
            "transcript_wer": error_rate(rows, "sentence", "transcript"),
            "transcript_wer_by_voice": {
                voice: error_rate(found, "sentence", "transcript")
                for voice, found in by_voice.items()
            },
            "reply_words_recovered": recovered(rows),
        },
        "turns": rows,
    }
    print(json.dumps(result["summary"], indent=2))
    if args.out:
        write(args.out, result)


if __name__ == "__main__":
    main()
