"""THE FAULT DRILL: break a running stack the ways production will, under spoken load, and
count what the users lost.

    python -m benchmarks.fault_drill --out benchmarks/results/fault_drill_lite.json
    python -m benchmarks.fault_drill --profile fake --scenarios junk,capacity_plus_one

Each scenario starts a fresh stack — Redis, ASR, TTS and the gateway, each its own process
(`voice-agent up`'s layout; `--profile lite` is `make run`'s engines: faster-whisper
tiny.en and Piper on the CPU, `silence` end of turn) — puts `--sessions` users on it who
speak espeak-ng sentences turn after turn and reconnect with `?session_id=` when closed,
waits until every user has had an answer, does its damage, and waits until every user has
had an answer to a turn begun after it:

- `kill9_asr`, `kill9_tts`, `kill9_gateway`: kill -9, the same service started again 1 s
  later;
- `redis_frozen`: SIGSTOP Redis for 10 s (every /health asked twice a second meanwhile);
- `redis_restarted_empty`: kill -9 Redis, an empty one on the same port 1 s later;
- `sigterm_gateway`: SIGTERM (it drains), started again 1 s after it exits;
- `capacity_plus_one`: the gateway admits `--sessions`; one more session comes;
- `slow_reader`: one more client asks for a long answer and reads nothing for 20 s;
- `junk`: 1 000 junk messages on each of /v1/stream, /v1/realtime, /v1/stream/asr and
  /v1/stream/tts;
- `tenant_resume_after_kill9`: authentication on; tenant `acme` speaks a turn, the gateway
  is killed -9 and restarted; acme resumes (must: resumed), a key of the tenant `default`
  tries to (must: 403).

Per scenario it prints and records turns completed / lost / cut mid-speech / duplicated
(benchmarks/fault_load.py says what each means), closes by code, and the recovery time.
docs/fault-drill.md has the results.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from benchmarks.fault_scenarios import (
    Drill,
    Fault,
    capacity_plus_one,
    env_auth_on,
    junk,
    kill_and_restart,
    redis_frozen,
    redis_restarted_empty,
    sigterm_gateway,
    slow_reader,
    tenant_resume_after_gateway_kill,
    under_load,
)
from services.loadtest.corpus import espeak_corpus
from services.loadtest.report import versions, write

Scenario = Callable[[Drill], Coroutine[Any, Any, dict[str, Any]]]


def _loaded(name: str, fault: Fault | None, **env: str) -> Scenario:
    """A fresh stack (with `env`) under load, and `fault` done to it."""

    async def scenario(drill: Drill) -> dict[str, Any]:
        with drill.stack(name, **env).running() as stack:
            return await under_load(drill, stack, fault)

    return scenario


async def _tenant(drill: Drill) -> dict[str, Any]:
    with drill.stack("tenant_resume_after_kill9", **env_auth_on()).running() as stack:
        return await tenant_resume_after_gateway_kill(drill, stack)


def _scenarios(sessions: int) -> dict[str, Scenario]:
    return {
        "baseline": _loaded("baseline", None),
        "kill9_asr": _loaded("kill9_asr", kill_and_restart("asr")),
        "kill9_tts": _loaded("kill9_tts", kill_and_restart("tts")),
        "kill9_gateway": _loaded("kill9_gateway", kill_and_restart("gateway")),
        "redis_frozen": _loaded("redis_frozen", redis_frozen),
        "redis_restarted_empty": _loaded("redis_restarted_empty", redis_restarted_empty),
        "sigterm_gateway": _loaded("sigterm_gateway", sigterm_gateway),
        "capacity_plus_one": _loaded(
            "capacity_plus_one", capacity_plus_one, VA_GATEWAY__MAX_SESSIONS=str(sessions)
        ),
        "slow_reader": _loaded("slow_reader", slow_reader),
        "junk": _loaded("junk", junk),
        "tenant_resume_after_kill9": _tenant,
    }


_SCORE = frozenset(
    {"sessions", "turns_completed", "turns_lost", "turns_cut_mid_speech", "turns_duplicated"}
    | {"lost_detail", "closes_by_code", "recovery_s", "scenario_s", "recovered", "warmup_turns"}
    | {"load_average_1min_at_start"}
)


def _line(name: str, result: dict[str, Any]) -> str:
    if "error" in result:
        return f"{name}: FAILED TO RUN: {result['error']}"
    own = {k: v for k, v in result.items() if k not in _SCORE}
    if "turns_completed" not in result:
        return f"{name}: {own}"
    return (
        f"{name}: turns completed {result['turns_completed']}, lost {result['turns_lost']}, "
        f"cut mid-speech {result['turns_cut_mid_speech']}, duplicated "
        f"{result['turns_duplicated']}; closes {result['closes_by_code']}; recovery "
        f"{result['recovery_s']} s; {own}"
    )


async def run(profile: str, sessions: int, names: list[str], workdir: Path) -> dict[str, Any]:
    corpus = [u.audio for u in espeak_corpus()]
    drill = Drill(profile, sessions, corpus, workdir)
    scenarios = _scenarios(sessions)
    results: dict[str, Any] = {}
    for name in names:
        started = time.monotonic()
        load_at_start = round(os.getloadavg()[0], 2)  # the machine is shared: say how busy
        try:
            result = await scenarios[name](drill)
        except Exception as exc:  # one scenario's failure must not hide the others'
            result = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        result["scenario_s"] = round(time.monotonic() - started, 1)
        result["load_average_1min_at_start"] = load_at_start
        results[name] = result
        print(_line(name, result), flush=True)
    return {
        "benchmark": "fault_drill",
        "profile": profile,
        "engines": "faster-whisper tiny.en + Piper (CPU)" if profile == "lite" else "fake",
        "sessions": sessions,
        "end_of_turn": "silence",
        "versions": versions("faster-whisper", "piper-tts", "redis", "uvicorn", "websockets"),
        "scenarios": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", choices=("lite", "fake"), default="lite")
    parser.add_argument("--sessions", type=int, default=4, help="talking users")
    parser.add_argument(
        "--scenarios", default="all", help="comma-separated names (default: all of them)"
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--logs", type=Path, help="keep every process's log here")
    args = parser.parse_args()
    known = list(_scenarios(args.sessions))
    names = known if args.scenarios == "all" else args.scenarios.split(",")
    unknown = sorted(set(names) - set(known))
    if unknown:
        parser.error(f"unknown scenarios {unknown}; choose from {', '.join(known)}")
    with tempfile.TemporaryDirectory(prefix="va-drill-") as workdir:
        logs = args.logs or Path(workdir)
        body = asyncio.run(run(args.profile, args.sessions, names, logs))
    if args.out:
        write(args.out, body)


if __name__ == "__main__":
    main()
