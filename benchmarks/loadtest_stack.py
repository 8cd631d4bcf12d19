"""Start a stack (lite or fake engines), optionally pinned to cores, and load-test it.

The gateway's admission (services/gateway/admission.py) is off here unless `--env` turns
it on: the run measures what the engines serve, not what admission lets in. The results
file is `voice-agent loadtest`'s (docs/loadtest.md), with this command as its `command`,
so the run can be repeated as written:

    python -m benchmarks.loadtest_stack --profile fake --gateway-cpu 0 --others-cpu 1 \\
        -- --sessions 25,50,100 --duration 30 --out benchmarks/results/loadtest_fake.json
"""

from __future__ import annotations

import argparse
import os
import sys

from benchmarks.stack import lite_stack
from services.loadtest.cli import add_arguments, execute
from services.loadtest.report import command


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", choices=("lite", "fake"), default="lite")
    parser.add_argument("--gateway-cpu", type=int, help="pin the gateway to this core")
    parser.add_argument(
        "--others-cpu", type=int, help="pin Redis, ASR, TTS and the load generator here"
    )
    parser.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="service setting"
    )
    parser.add_argument("loadtest", nargs=argparse.REMAINDER, help="-- voice-agent loadtest args")
    args = parser.parse_args()
    words = args.loadtest[1:] if args.loadtest[:1] == ["--"] else args.loadtest
    cpus: dict[str, set[int]] = {}
    if args.gateway_cpu is not None:
        cpus["gateway"] = {args.gateway_cpu}
    if args.others_cpu is not None:
        cpus.update({name: {args.others_cpu} for name in ("redis", "asr", "tts")})
        os.sched_setaffinity(0, {args.others_cpu})  # the load generator (and its workers)
    env = {"VA_GATEWAY__ADMISSION__ENABLED": "false"}
    env.update(item.split("=", 1) for item in args.env)
    with lite_stack({"VA_PROFILE": args.profile, **env}, cpus) as urls:
        loadtest = argparse.ArgumentParser(prog="voice-agent loadtest")
        add_arguments(loadtest)
        options = loadtest.parse_args(
            [
                "--url",
                urls["gateway"].replace("http", "ws") + "/v1/stream",
                "--asr-url",
                urls["asr"],
                "--tts-url",
                urls["tts"],
                *words,
            ]
        )
        return execute(options, command())


if __name__ == "__main__":
    sys.exit(main())
