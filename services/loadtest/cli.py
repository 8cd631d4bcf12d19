"""`voice-agent loadtest`: N concurrent simulated users against the gateway's /v1/stream.

    voice-agent loadtest --sessions 1,2,4,8 --duration 60 --out loadtest.json --plots plots/

Each level of `--sessions` runs in turn, smallest first: sessions start spread over
`--ramp` seconds, then `--duration` seconds are measured. Users speak at real-time pace,
listen to the agent's whole reply (or talk over it), think and go on. The capacity is the
most sessions whose voice-to-voice p95 stays within the budget (`--budget-ms`; by default
max(1.5 × the one-session p95, 1 s)) with no turn lost; the run stops at the first level
over it. The results file (docs/loadtest.md) has per-stage latencies, where the time went
(the services' metrics), errors by code, word accuracy, server figures and every break of
the wire contract. Exit status: 0 fine; 1 the service broke the contract or the error
rate passed `--max-error-rate`; 2 a usage error or no connection at all. With
authentication on, give an API key (or client token) in `VA_API_KEY`: every session and
the services' /health and /metrics get it as `Authorization: Bearer`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import shlex
import sys
import threading
import time
from pathlib import Path
from typing import Any, Final

from services.client.credentials import api_key_from_env, refusal
from services.client.stream import StreamClient
from services.common.platform.extras import MissingExtra, require_extra
from services.loadtest.breakdown import breakdown, engine_ms, gateway_added_omitted
from services.loadtest.capacity import (
    BUDGET_FACTOR,
    BUDGET_FLOOR_MS,
    MIN_P95_SAMPLES,
    Budget,
    budget_from,
    find_capacity,
    too_few_turns,
)
from services.loadtest.corpus import CorpusError, Utterance, espeak_corpus, folder_corpus
from services.loadtest.level import LevelPart, figures_of, judge, level_report, mark_growth
from services.loadtest.progress import ProgressLine
from services.loadtest.report import unwritable, write
from services.loadtest.server import (
    Sample,
    Services,
    gateway_counters,
    http_base,
    level_histograms,
    server_report,
)
from services.loadtest.summary import level_line, summary_text
from services.loadtest.user import UserPlan, Window
from services.loadtest.workers import Workers, run_local, split

DEFAULT_URL: Final = "ws://127.0.0.1:8000/v1/stream"
START_MARGIN_S: Final = {"local": 0.2, "workers": 3.0}
"""Time to get every session's process ready before a level's clock starts."""
CLIENT_LAG_WARN_MS: Final = 50.0
"""Audio frames leaving this late (p99) mean the client, not the service, is the limit."""
BASELINE_MAX_EXTRA_S: Final = 300.0
"""How far past --duration the one-session level may go on to collect --baseline-turns."""


# ---------------------------------------------------------------------- arguments


def _sessions(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError("a positive number or a comma list such as 1,5,10,20")
    return levels


def _seconds_range(text: str) -> tuple[float, float]:
    try:
        low, high = (float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError("MIN,MAX in seconds, such as 1,3") from None
    if not (math.isfinite(low) and math.isfinite(high)):
        raise argparse.ArgumentTypeError("MIN and MAX must be finite numbers of seconds")
    if not 0 <= low <= high:
        raise argparse.ArgumentTypeError("need 0 <= MIN <= MAX")
    return low, high


def _bounded(kind: type[float] | type[int], low: float, high: float) -> Any:
    def parse(text: str) -> float:
        value = kind(text)
        if not math.isfinite(value) or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low:g} and {high:g}")
        return value

    parse.__name__ = kind.__name__
    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--url", default=DEFAULT_URL, help="the gateway's /v1/stream")
    add("--sessions", type=_sessions, default=[1], help="concurrent sessions: N or a list 1,5,10")
    add("--ramp", type=_bounded(float, 0, 3600), default=5.0, help="seconds to start sessions")
    add("--duration", type=_bounded(float, 1, 86400), default=60.0, help="measured s per level")
    add("--audio", type=Path, help="folder of .wav (+ NAME.txt scripts); default: espeak-ng")
    add("--barge-in-rate", type=_bounded(float, 0, 1), default=0.2, help="share of turns")
    add(
        "--think-s",
        "--pause",
        dest="think_s",
        type=_seconds_range,
        default=(0.2, 2.0),
        help="MIN,MAX seconds a user waits after the reply has played before speaking again",
    )
    add("--frame-ms", type=_bounded(int, 10, 1000), default=20, help="audio frame size")
    add("--workers", type=_bounded(int, 1, 256), default=1, help="client processes")
    add("--asr-url", help="the ASR service's base URL (its /health and /metrics are sampled)")
    add("--tts-url", help="the TTS service's base URL (its /health and /metrics are sampled)")
    add(
        "--budget-ms",
        type=_bounded(float, 1, 600_000),
        help="voice-to-voice p95 budget (default: max(FACTOR × one-session p95, FLOOR))",
    )
    add("--budget-factor", type=_bounded(float, 1, 100), default=BUDGET_FACTOR, help="FACTOR")
    add("--budget-floor-ms", type=_bounded(float, 0, 600_000), default=BUDGET_FLOOR_MS)
    add("--keep-going", action="store_true", help="run every level, past the capacity too")
    add(
        "--baseline-turns",
        type=_bounded(int, 0, 1000),
        default=MIN_P95_SAMPLES,
        help="the one-session level goes on past --duration (at most "
        f"{BASELINE_MAX_EXTRA_S:.0f} s more) until this many turns started in its window: its "
        f"p95 sets the budget, and a p95 needs {MIN_P95_SAMPLES} (0: --duration only)",
    )
    add("--max-error-rate", type=_bounded(float, 0, 1), default=0.05, help="errors per turn")
    add("--reply-timeout", type=_bounded(float, 1, 600), default=20.0, help="s to await a reply")
    add("--seed", type=int, default=0, help="what each user says and when it barges in")
    add("--out", type=Path, help="results JSON (docs/loadtest.md)")
    add("--plots", type=Path, help="folder for the PNG plots")


def add_loadtest_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `loadtest` on the CLI's subcommands."""
    summary = __doc__.split("\n")[0] if __doc__ else "load test"
    parser = sub.add_parser(
        "loadtest",
        help="concurrent simulated users against /v1/stream",
        description=summary,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    """The CLI's entry: exits with the load test's status."""
    command_line = shlex.join(["voice-agent", *sys.argv[1:]])
    status = execute(args, command_line, api_key_from_env())
    if status:
        raise SystemExit(status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="voice-agent loadtest", formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    add_arguments(parser)
    words = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(words)
    return execute(args, shlex.join(["voice-agent", "loadtest", *words]), api_key_from_env())


# ---------------------------------------------------------------------- the run


def _fail(message: str) -> int:
    print(f"voice-agent loadtest: error: {message}", file=sys.stderr, flush=True)
    return 2


async def _probe(url: str, api_key: str | None) -> None:
    """One session opened and closed: the gateway answers at all."""
    async with StreamClient(url, api_key=api_key) as client:
        await client.send({"type": "session.close"})


def _refused(exc: Exception, url: str, api_key: str | None) -> str:
    """Why the first session did not open, in one line."""
    return refusal(exc, url, api_key) or f"cannot open a session at {url}: {exc!r}"


def execute(args: argparse.Namespace, command_line: str, api_key: str | None = None) -> int:
    """Run every level; write the results and plots; the exit status. `api_key` (an API
    key or client token) goes with every session and every /health and /metrics sample."""
    if not str(args.url).startswith(("ws://", "wss://")):
        return _fail(f"--url must be ws:// or wss://, not {args.url!r}")
    for flag, path, kind in (("--out", args.out, "file"), ("--plots", args.plots, "folder")):
        why = unwritable(path, kind) if path is not None else None
        if why is not None:
            return _fail(f"{flag} {path}: {why}")
    try:
        require_extra("loadtest")
    except MissingExtra as exc:
        return _fail(str(exc))
    try:
        corpus = folder_corpus(args.audio) if args.audio else espeak_corpus()
    except CorpusError as exc:
        return _fail(str(exc))
    try:
        asyncio.run(_probe(args.url, api_key))
    except Exception as exc:
        return _fail(_refused(exc, args.url, api_key))
    urls = {"gateway": http_base(args.url), "asr": args.asr_url, "tts": args.tts_url}
    services = Services(urls, api_key)
    target = {name: s.health if s else None for name, s in services.sample().items()}
    levels, budget = _run_levels(args, _plan(args, corpus, api_key), services)
    result = _result(args, corpus, target, levels, budget)
    print(summary_text(result), flush=True)  # first: a file that cannot be written loses nothing
    try:
        if args.out:
            write(args.out, result, command_line)
        if args.plots:
            from services.loadtest.plots import write_plots

            write_plots(result, args.plots)
    except OSError as exc:
        return _fail(f"cannot write the results: {exc}")
    return 0 if result["ok"] else 1


def _plan(args: argparse.Namespace, corpus: list[Utterance], api_key: str | None) -> UserPlan:
    return UserPlan(
        url=args.url,
        corpus=tuple(corpus),
        frame_ms=args.frame_ms,
        barge_in_rate=args.barge_in_rate,
        think_s=args.think_s,
        reply_timeout_s=args.reply_timeout,
        seed=args.seed,
        api_key=api_key,
    )


def levels_to_run(args: argparse.Namespace) -> list[int]:
    """`--sessions`, smallest first; without `--budget-ms` a one-session level comes first
    (the budget is made from it)."""
    levels = sorted(set(args.sessions))
    if args.budget_ms is None and levels[0] != 1:
        levels.insert(0, 1)
    return levels


def _run_levels(
    args: argparse.Namespace, plan: UserPlan, services: Services
) -> tuple[list[dict[str, Any]], Budget | None]:
    """Run the levels in turn until one is over the budget (all with --keep-going)."""
    sessions_list = levels_to_run(args)
    progress = ProgressLine(levels=len(sessions_list))
    workers = Workers(args.workers) if args.workers > 1 else None
    levels: list[dict[str, Any]] = []
    budget = budget_from(None, args.budget_ms, args.budget_factor, args.budget_floor_ms)
    try:
        for sessions in sessions_list:
            level = _run_level(args, plan, services, sessions, workers, progress)
            levels.append(level)
            v2v = level["stages_ms"]["voice_to_voice"]
            enough = too_few_turns(v2v["count"]) is None
            if budget is None and sessions == 1 and level["lost_turns"] == 0 and enough:
                p95 = v2v["p95"]
                budget = budget_from(p95, None, args.budget_factor, args.budget_floor_ms)
            state = judge(level, budget.ms if budget else None, no_budget_why(levels))
            mark_growth(levels)
            print(level_line(level), file=sys.stderr, flush=True)
            _warn_if_client_lagged(level)
            if state == "over" and not args.keep_going:
                break
    finally:
        if workers is not None:
            workers.close()
    return levels, budget


def _run_level(
    args: argparse.Namespace,
    plan: UserPlan,
    services: Services,
    sessions: int,
    workers: Workers | None,
    progress: ProgressLine,
) -> dict[str, Any]:
    margin = START_MARGIN_S["workers" if workers else "local"]
    baseline = sessions == 1 and args.baseline_turns > 0
    timeline = Window(
        time.time() + margin,
        args.ramp,
        args.duration,
        sessions,
        min_turns=args.baseline_turns if baseline else 0,
        max_extra_s=BASELINE_MAX_EXTRA_S if baseline else 0.0,
    )
    jobs = split(plan, timeline, args.workers)
    before = _LaterSample(services, timeline.measured_from - time.time())
    progress.start_level(timeline)
    if workers is None:
        part: LevelPart = asyncio.run(run_local(jobs[0], progress))
    else:
        part = workers.run(jobs, progress)
    progress.end_level()
    after = services.sample(window_s=time.time() - timeline.start)
    before.join()
    start, end = level_histograms(before.sample), level_histograms(after)
    v2v = part.samples_ms["voice_to_voice"]
    client_mean = sum(v2v) / len(v2v) if v2v else None
    engines = engine_ms(start, end)
    return level_report(
        part,
        sessions,
        args.duration,
        engines,
        server_report(before.sample, after),
        breakdown(start, end, client_mean),
        gateway_added_omitted(engines, gateway_counters(before.sample), gateway_counters(after)),
    )


def _warn_if_client_lagged(level: dict[str, Any]) -> None:
    lag = level["client"]["send_lag_ms"]["p99"]
    if lag is not None and lag > CLIENT_LAG_WARN_MS:
        print(
            f"warning: the load generator itself fell behind (send lag p99 {lag:.0f} ms): "
            "latencies are overstated; use more --workers or another machine",
            file=sys.stderr,
            flush=True,
        )


class _LaterSample(threading.Thread):
    """The services sampled when the measured window opens (after the ramp's warm-up)."""

    def __init__(self, services: Services, delay_s: float) -> None:
        super().__init__(name="sample-services", daemon=True)
        self.services, self.delay_s = services, delay_s
        self.sample: dict[str, Sample | None] = {}
        self.start()

    def run(self) -> None:
        time.sleep(max(0.0, self.delay_s))
        self.sample = self.services.sample()


def _result(
    args: argparse.Namespace,
    corpus: list[Utterance],
    target: dict[str, Any],
    levels: list[dict[str, Any]],
    budget: Budget | None,
) -> dict[str, Any]:
    violations = [v for level in levels for v in level.pop("contract_violations")]
    too_many_errors = any(level["error_rate"] > args.max_error_rate for level in levels)
    return {
        "benchmark": "loadtest",
        "target": {"url": args.url, **target},
        "config": {
            "sessions": levels_to_run(args),
            "ramp_s": args.ramp,
            "duration_s": args.duration,
            "barge_in_rate": args.barge_in_rate,
            "corpus": str(args.audio) if args.audio else "espeak",
            "utterances": len(corpus),
            "frame_ms": args.frame_ms,
            "think_s": list(args.think_s),
            "workers": args.workers,
            "budget_ms": args.budget_ms,
            "budget_factor": args.budget_factor,
            "budget_floor_ms": args.budget_floor_ms,
            "baseline_turns": args.baseline_turns,
            "keep_going": args.keep_going,
            "max_error_rate": args.max_error_rate,
            "seed": args.seed,
        },
        "budget": None if budget is None else dataclasses.asdict(budget),
        "capacity": capacity_of(levels, budget),
        "levels": levels,
        "contract_violations": violations,
        "ok": not violations and not too_many_errors,
    }


def capacity_of(levels: list[dict[str, Any]], budget: Budget | None) -> dict[str, Any]:
    """The run's capacity: the most sessions within the budget with no turn lost, the first
    level over it, why, and the stage that grew there."""
    if budget is None or not levels:
        why = no_budget_why(levels)
        return {"sessions": None, "at_least": False, "over_at": None, "why": why, "grows": None}
    found = find_capacity([figures_of(level) for level in levels], budget.ms)
    over = next((lv for lv in levels if lv["sessions"] == found.over_at), None)
    return {
        "sessions": found.sessions,
        "at_least": found.at_least,
        "over_at": found.over_at,
        "why": found.why,
        "grows": over["grows"] if over is not None else None,
        "noisy": found.noisy,
    }


def no_budget_why(levels: list[dict[str, Any]]) -> str:
    """Why the run has no budget (the one-session level did not make one)."""
    single = next((level for level in levels if level["sessions"] == 1), None)
    if single is None:
        return "no budget: no one-session level to make it"
    count = single["stages_ms"]["voice_to_voice"].get("count")
    if single["lost_turns"]:
        return "no budget: the one-session level lost a turn"
    if count == 0:
        return "no budget: the one-session level answered no turn"
    few = too_few_turns(count)
    if few is not None:
        return (
            f"no budget: the one-session level's {few}; give --budget-ms, or a longer "
            "--duration or more --baseline-turns"
        )
    return "no budget: the one-session level answered no turn, or lost one"
