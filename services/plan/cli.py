"""`voice-agent plan`: a capacity plan computed from measurement files, every figure traced.

    voice-agent plan benchmarks/results --target-sessions 30 --users 1000 \\
        --concurrency-ratio 0.05 --headroom 0.2 --out plans/capacity.md --json plans/capacity.json

Reads loadtest results (`voice-agent loadtest`) and the engine benchmarks under
benchmarks/ (asr_batching, tts_stream, voice_to_voice, barge_in). Measured figures are
copied from a file; figures computed beyond what was measured are marked ESTIMATE and
carry their formula; every figure carries the file, command, time, machine and field it
came from. What was not measured is said, with the command that would measure it.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from pydantic import ValidationError

from services.loadtest.report import unwritable
from services.plan.build import build_plan
from services.plan.inputs import PlanInputError, load_measurements
from services.plan.model import PlanOptions
from services.plan.render import render_json, render_markdown


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "inputs",
        nargs="*",
        type=Path,
        default=[Path("benchmarks/results")],
        help="measurement files or directories of *.json (default: benchmarks/results)",
    )
    parser.add_argument("--target-sessions", type=int, help="concurrency to report latency at")
    parser.add_argument("--users", type=int, help="users to size for")
    parser.add_argument(
        "--concurrency-ratio", type=float, help="fraction of the users in a conversation at peak"
    )
    parser.add_argument(
        "--turns-per-minute",
        type=float,
        help="turns per session-minute (default: the pace the loadtest measured)",
    )
    parser.add_argument(
        "--headroom", type=float, default=0.0, help="spare capacity, e.g. 0.2 for 20%%"
    )
    parser.add_argument(
        "--asr-calls-per-turn",
        type=float,
        default=1.0,
        help="ASR model calls per turn for the ASR estimate (1: the final; partials add more)",
    )
    parser.add_argument(
        "--reply-s-per-turn",
        type=float,
        help="seconds of agent speech per turn for the TTS estimate (default: the benchmark's)",
    )
    parser.add_argument(
        "--hosts-for",
        type=_int_list,
        default=[1_000, 10_000, 50_000],
        help="concurrent sessions to size hosts for, e.g. 1000,10000,50000 (the seeds' scales)",
    )
    parser.add_argument(
        "--gateway-host-cores",
        type=int,
        default=16,
        help="CPU cores of a gateway host (one gateway process per core, one core spare)",
    )
    parser.add_argument(
        "--redis-turns-per-s",
        type=float,
        help="turns/s one Redis master carries, measured (default: the most a loadtest ran)",
    )
    parser.add_argument(
        "--budget-ms",
        type=float,
        help="voice-to-voice p95 budget to judge every loadtest by (default: each file's own)",
    )
    parser.add_argument("--out", type=Path, help="write the markdown plan here too")
    parser.add_argument("--json", type=Path, help="write the plan as JSON here")


def _int_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None


def _options(args: argparse.Namespace) -> PlanOptions:
    try:
        return PlanOptions(**{name: getattr(args, name) for name in PlanOptions.model_fields})
    except ValidationError as exc:
        error = exc.errors()[0]
        flag = "--" + str(error["loc"][0]).replace("_", "-")
        raise PlanInputError(f"{flag}: {error['msg']}") from exc


def _fail(message: str, status: int) -> SystemExit:
    print(f"voice-agent plan: error: {message}", file=sys.stderr, flush=True)
    return SystemExit(status)


def run(args: argparse.Namespace) -> None:
    """The `plan` subcommand: print the plan; write it to --out and --json when given.
    Exit status 2 for a bad option, 1 for a measurement file it cannot use."""
    argv = getattr(args, "argv", None)
    command = shlex.join(["voice-agent", "plan", *(argv if argv is not None else sys.argv[2:])])
    try:
        options = _options(args)
    except PlanInputError as exc:
        raise _fail(str(exc), 2) from exc
    for flag, path in (("--out", args.out), ("--json", args.json)):
        why = unwritable(path) if path is not None else None
        if why is not None:
            raise _fail(f"{flag} {path}: {why}", 2)
    try:
        measurements, ignored = load_measurements(args.inputs)
    except PlanInputError as exc:
        raise _fail(str(exc), 1) from exc
    plan = build_plan(measurements, options, ignored, command)
    text = render_markdown(plan)
    print(text, end="", flush=True)
    for path, body in ((args.out, text), (args.json, render_json(plan))):
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(body, encoding="utf-8")
            except OSError as exc:
                raise _fail(f"cannot write {path}: {exc}", 2) from exc
            print(f"wrote {path}", file=sys.stderr, flush=True)


def add_plan_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `plan` on the CLI's subcommands."""
    plan = sub.add_parser("plan", help="a capacity plan from measurement files")
    _add_arguments(plan)
    plan.set_defaults(func=run)


def main(argv: list[str] | None = None) -> None:
    """`python -m services.plan ARGS`: the same as `voice-agent plan ARGS`."""
    parser = argparse.ArgumentParser(prog="voice-agent plan", description=__doc__.split("\n")[0])
    _add_arguments(parser)
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    run(args)
