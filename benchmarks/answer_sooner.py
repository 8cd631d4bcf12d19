"""Answering sooner, configuration by configuration: where every millisecond goes from the
end of the speech to the first agent audio byte, and what a turn costs in CPU.

    python -m benchmarks.answer_sooner --out benchmarks/results/answer_sooner_lite.json

For each configuration, starts the default `make run` stack (Redis, ASR tiny.en, TTS Piper,
the gateway with Smart Turn) as separate processes with the configuration's environment,
and, for the `openai` agent, an OpenAI-compatible server of known cost
(benchmarks/llm_server.py: its time to first token and token rate are settings, its reply
repeats the user's words as the echo agent does). Then speaks requests in voices the
tests do not use, one turn at a time, at real-time pace, and records per turn, from the
end of the speech (the last voiced sample, as `StreamClient` measures it): the end-of-turn
decision (`speech.stopped`), the final transcript, `response.created`, the agent's first
text, and the first agent audio byte (voice-to-voice); and per configuration the CPU
seconds each service spent per turn (`/health`, kernel-counted per process).

Configurations: the 600 ms silence rule and smart-turn, with the reply prepared during
the pause off and on, with the echo agent and with the `openai` agent at a time to first
token of 0, 300 and 600 ms (50 tokens/s).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from benchmarks.cpu_per_turn import REQUESTS
from benchmarks.stack import lite_stack
from benchmarks.voices import RATE, Voice, espeak, piper
from services.client.stream import Received, StreamClient
from services.common.stats import summary
from services.loadtest.report import write
from services.ops.redis_server import free_port

VOICES: dict[str, Voice] = {
    "espeak en-us 150 wpm": espeak("en-us", 150),
    "piper joe 1.1": piper(1.1),
}
STAGES = ("decided", "transcript", "created", "first_text", "voice_to_voice")
SERVICES = ("asr", "tts", "gateway")
SILENCE = {"VA_GATEWAY__END_OF_TURN": "silence"}
UNPREPARED = {"VA_GATEWAY__PREPARE_REPLIES": "false"}
EARLY = {"VA_VAD__PAUSE_MS": "64", "VA_VAD__TRAILING_PAD_MS": "64"}  # the default since
PAUSE_100 = {"VA_VAD__PAUSE_MS": "100", "VA_VAD__TRAILING_PAD_MS": "100"}  # before
CLAUSES_ONLY = {"VA_GATEWAY__FIRST_CHUNK_PHRASE": "false"}
ASR_ONE_THREAD = {"VA_ASR__WHISPER__CPU_THREADS": "1"}


def configurations() -> dict[str, tuple[dict[str, str], float | None]]:
    """name → (gateway environment, the LLM's time to first token in ms or None: echo)."""
    configs: dict[str, tuple[dict[str, str], float | None]] = {
        "silence 600 ms, echo": ({**SILENCE, **UNPREPARED}, None),
        "silence 600 ms, echo, prepared": (SILENCE, None),
        "smart-turn, echo": (UNPREPARED, None),
        "smart-turn, echo, prepared (default)": ({}, None),
    }
    # the speculation (and the prepared reply) from a 64 ms pause, not 128 ms (100 ms on the
    # VAD's 32 ms grid); Smart Turn is still first asked at 100 ms (the same grid point).
    # 64 ms is the default since: the named rows equal the default, and the "(before)"
    # rows run the comparison again
    configs["smart-turn, echo, prepared, speculation at 64 ms"] = (EARLY, None)
    configs["smart-turn, echo, prepared, pause 100 ms (before)"] = (PAUSE_100, None)
    # the naive baseline with a real agent: what the default install answered before
    configs["silence 600 ms, openai TTFT 300 ms"] = ({**SILENCE, **UNPREPARED}, 300.0)
    for ttft in (0, 300, 600):
        configs[f"smart-turn, openai TTFT {ttft} ms"] = (UNPREPARED, float(ttft))
        configs[f"smart-turn, openai TTFT {ttft} ms, prepared"] = ({}, float(ttft))
    configs["smart-turn, openai TTFT 300 ms, prepared, speculation at 64 ms"] = (EARLY, 300.0)
    configs["smart-turn, openai TTFT 300 ms, prepared, pause 100 ms (before)"] = (
        PAUSE_100,
        300.0,
    )
    # before the first chunk could be cut before a phrase: at a clause or sentence end only
    configs["smart-turn, echo, prepared, first chunk at clauses only"] = (CLAUSES_ONLY, None)
    configs["smart-turn, openai TTFT 300 ms, prepared, first chunk at clauses only"] = (
        CLAUSES_ONLY,
        300.0,
    )
    # CTranslate2 on one thread per ASR call (its default is four: on two cores the
    # decoder's many small steps lose more to the threads' hand-offs than they gain)
    configs["smart-turn, echo, prepared, ASR one thread"] = (ASR_ONE_THREAD, None)
    # one thread is the default since: the comparison again
    configs["smart-turn, echo, prepared, ASR CTranslate2's threads (before)"] = (
        {"VA_ASR__WHISPER__CPU_THREADS": "0"},
        None,
    )
    # a shorter first chunk: the first TTS piece waits for fewer streamed words
    for words in (3, 4):
        configs[f"smart-turn, openai TTFT 300 ms, prepared, first chunk {words} words"] = (
            {"VA_GATEWAY__FIRST_CHUNK_WORDS": str(words)},
            300.0,
        )
    return configs


@contextlib.contextmanager
def llm_server(ttft_ms: float | None) -> Iterator[dict[str, str]]:
    """The LLM of known cost as a process of its own; the gateway environment that uses it."""
    if ttft_ms is None:
        yield {}
        return
    port = free_port()
    command = [sys.executable, "-m", "benchmarks.llm_server", "--port", str(port)]
    command += ["--ttft-ms", str(ttft_ms), "--tokens-per-s", "50", "--reply", "{user}"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _until_listed(f"http://127.0.0.1:{port}/v1/models", proc)
        yield {"VA_LLM__BASE_URL": f"http://127.0.0.1:{port}/v1"}  # the default agent: openai
    finally:
        proc.terminate()
        proc.wait(10)


def _until_listed(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"llm_server exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        time.sleep(0.2)
    raise SystemExit(f"llm_server did not answer {url} in {timeout_s:.0f} s")


async def speak_turns(url: str, turns: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """One row per turn, timed by the response to the whole utterance: one created after
    its last voiced sample. A response begun at a pause inside the sentence (a cut-off,
    then interrupted by the words that follow) is counted (`answered_inside`), not timed:
    timing by the first event of each kind would take the cut-off's."""
    rows = []
    audio_at: list[float] = []
    async with StreamClient(url) as client:
        client.on_message = lambda now, message: (
            audio_at.append(now) if isinstance(message, bytes) else None
        )
        for voice, sentence in turns:
            turn = client.new_turn()
            audio_at.clear()
            await client.speak(VOICES[voice](sentence), RATE)
            end = turn.last_speech_sent_at or 0.0
            answer = await client.silence_until(
                "response.done", timeout_s=30, predicate=_created_after(turn, end)
            )
            rows.append(_turn_row(voice, sentence, turn, end, str(answer["response_id"]), audio_at))
    return rows


def _created_after(turn: Received, end: float) -> Callable[[dict[str, Any]], bool]:
    """Whether a `response.done` is that of a response created after `end`."""
    return lambda event: any(
        response_id == event.get("response_id") for _, response_id in turn.responses_created(end)
    )


def _turn_row(
    voice: str,
    sentence: str,
    turn: Received,
    end: float,
    answer: str,
    audio_at: list[float],
) -> dict[str, Any]:
    created_at = next(at for at, rid in turn.responses_created(end) if rid == answer)

    def since(kind: str, after: float = end, response: str | None = None) -> float | None:
        at = next(
            (
                t
                for t, e in turn.events
                if t >= after
                and e.get("type") == kind
                and (response is None or e.get("response_id") == response)
            ),
            None,
        )
        return None if at is None else round((at - end) * 1000, 1)

    first_audio = next((t for t in audio_at if t >= created_at), None)
    return {
        "voice": voice,
        "sentence": sentence,
        "transcript": " / ".join(e.get("text", "") for e in turn.of_type("transcript.final")),
        "answered_inside": len(turn.of_type("response.created")) - len(turn.responses_created(end)),
        "decided": since("speech.stopped"),
        "transcript_ms": since("transcript.final"),
        "created": round((created_at - end) * 1000, 1),
        "first_text": since("response.text.delta", created_at, answer),
        "voice_to_voice": None if first_audio is None else round((first_audio - end) * 1000, 1),
    }


def cpu_seconds(urls: dict[str, str]) -> dict[str, float]:
    return {
        name: float(httpx.get(f"{urls[name]}/health", timeout=10).json()["process"]["cpu_seconds"])
        for name in SERVICES
    }


def measure(env: dict[str, str], ttft_ms: float | None, per_voice: int) -> dict[str, Any]:
    turns = [(v, REQUESTS[i % len(REQUESTS)]) for v in VOICES for i in range(per_voice)]
    with llm_server(ttft_ms) as llm_env, lite_stack({**env, **llm_env}) as urls:
        url = urls["gateway"].replace("http", "ws") + "/v1/stream"
        asyncio.run(speak_turns(url, turns[:1]))  # warm-up: first calls pay for allocations
        before = cpu_seconds(urls)
        rows = asyncio.run(speak_turns(url, turns))
        after = cpu_seconds(urls)
        prepared = _prepared(httpx.get(f"{urls['gateway']}/metrics", timeout=10).text)
    cpu = {name: round((after[name] - before[name]) / len(rows), 3) for name in SERVICES}
    stages = {
        "decided": [r["decided"] for r in rows],
        "transcript": [r["transcript_ms"] for r in rows],
        "created": [r["created"] for r in rows],
        "first_text": [r["first_text"] for r in rows],
        "voice_to_voice": [r["voice_to_voice"] for r in rows],
    }
    return {
        "env": {**env, **({"llm_ttft_ms": str(ttft_ms)} if ttft_ms is not None else {})},
        "turns": len(rows),
        # a response begun at a pause inside the sentence: the user was cut off
        "answered_inside": sum(1 for r in rows if r["answered_inside"]),
        "stages_ms": {
            k: summary([float(x) for x in v if x is not None]) for k, v in stages.items()
        },
        "cpu_seconds_per_turn": {**cpu, "total": round(sum(cpu.values()), 3)},
        "prepared_replies": prepared,
        "rows": rows,
    }


def _prepared(metrics: str) -> dict[str, float]:
    found = {}
    for line in metrics.splitlines():
        if line.startswith("va_gateway_prepared_replies_total{"):
            outcome = line.split('outcome="')[1].split('"')[0]
            found[outcome] = float(line.split()[-1])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-voice", type=int, default=6, help="turns per voice")
    parser.add_argument("--config", action="append", help="only these configurations")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results: dict[str, Any] = {}
    for name, (env, ttft) in configurations().items():
        if args.config and name not in args.config:
            continue
        results[name] = measure(env, ttft, args.per_voice)
        brief = {k: v for k, v in results[name].items() if k != "rows"}
        print(name, json.dumps(brief), flush=True)
    if args.out:
        write(
            args.out,
            {
                "benchmark": "answer_sooner",
                "profile": "lite (tiny.en int8, Piper joe, Silero VAD, Smart Turn v3.2)",
                "voices": list(VOICES),
                "load_average": os.getloadavg()[0],
                "configurations": results,
            },
        )


if __name__ == "__main__":
    main()
