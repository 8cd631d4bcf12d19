"""`voice-agent`: one command line over every service.

voice-agent up                       Redis (if none) + ASR + TTS + gateway, until Ctrl-C
voice-agent asr|tts|gateway [--port] one service
voice-agent client --wav FILE        talk to the agent with a wav file
voice-agent doctor                   check GPUs, models, Redis, ports and nginx
voice-agent models pull NAME [--dir] download model weights (models list: the names)
voice-agent loadtest --sessions 1,5,10 simulated users against /v1/stream; JSON + plots
voice-agent plan [FILES]             a capacity plan from measurement files
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from services.common.redis_server import reachable, start_redis
from services.common.serve import load_settings, run_service


def wait_ready(
    urls: dict[str, str],
    procs: list[subprocess.Popen[bytes]],
    timeout_s: float,
    logs: str = "its log above",
) -> None:
    """Until every service answers /ready; SystemExit when one exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    waiting = dict(urls)
    while waiting and time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                raise SystemExit(f"a service exited with {proc.returncode}; see {logs}")
        for name, url in list(waiting.items()):
            try:
                if httpx.get(f"{url}/ready", timeout=1.0).status_code == 200:
                    del waiting[name]
            except httpx.HTTPError:
                pass
        time.sleep(0.2)
    if waiting:
        raise SystemExit(f"not ready after {timeout_s:.0f} s: {', '.join(waiting)}; see {logs}")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def up(args: argparse.Namespace) -> None:
    """Start everything, print where to connect, stop everything on Ctrl-C."""
    settings = load_settings("gateway")
    procs: list[subprocess.Popen[bytes]] = []
    env = dict(os.environ)
    if not reachable(settings.redis.url):
        port = int(settings.redis.url.rsplit(":", 1)[-1].split("/")[0] or 6379)
        print(f"no Redis at {settings.redis.url}: starting one on port {port}", flush=True)
        procs.append(start_redis(port, Path(args.state_dir) / "redis"))
    ports = {"asr": 8001, "tts": 8002, "gateway": 8000}
    for service, port in ports.items():
        env_port = os.environ.get(f"VA_{service.upper()}__SERVER__PORT")
        ports[service] = int(env_port) if env_port else port
        cmd = [sys.executable, "-m", f"services.{service}.server", "--port", str(ports[service])]
        procs.append(subprocess.Popen(cmd, env=env))
    try:
        wait_ready({s: f"http://127.0.0.1:{p}" for s, p in ports.items()}, procs[-3:], 120)
        print(
            "\nvoice-agent is up:\n"
            f"  agent      ws://127.0.0.1:{ports['gateway']}/v1/stream\n"
            f"  ASR        http://127.0.0.1:{ports['asr']}  (POST /v1/audio/transcriptions, "
            "WS /v1/stream/asr)\n"
            f"  TTS        http://127.0.0.1:{ports['tts']}  (POST /v1/audio/speech, "
            "WS /v1/stream/tts)\n"
            f"  try:       voice-agent client --wav your.wav --url ws://127.0.0.1:{ports['gateway']}"
            "/v1/stream\n  Ctrl-C stops everything.",
            flush=True,
        )
        signal.signal(signal.SIGTERM, _interrupt)
        while all(proc.poll() is None for proc in procs):
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def client(args: argparse.Namespace) -> None:
    """Talk to the agent with a wav file."""
    from services.common.client import talk

    asyncio.run(talk(args.url, Path(args.wav), Path(args.out) if args.out else None, args.timeout))


def config(args: argparse.Namespace) -> None:
    """Print every setting (as markdown for the docs)."""
    from services.common.settings_doc import markdown

    print(markdown())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="voice-agent", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="start Redis (if none), ASR, TTS and the gateway")
    p_up.add_argument("--state-dir", default="var", help="where a started Redis keeps its files")
    p_up.set_defaults(func=up)
    for service in ("asr", "tts", "gateway"):
        p = sub.add_parser(service, help=f"run the {service} service", add_help=False)
        p.set_defaults(func=None, service=service)
    p_client = sub.add_parser("client", help="stream a wav file to /v1/stream")
    p_client.add_argument("--wav", required=True, help="a 16-bit PCM wav file")
    p_client.add_argument("--url", default="ws://127.0.0.1:8000/v1/stream")
    p_client.add_argument("--out", default="reply.wav", help="where to save the agent's audio")
    p_client.add_argument("--timeout", type=float, default=30.0)
    p_client.set_defaults(func=client)
    p_config = sub.add_parser("config", help="print every setting, its default and meaning")
    p_config.add_argument("--markdown", action="store_true", help="(the only format for now)")
    p_config.set_defaults(func=config)
    from services.common.doctor import add_parser as add_doctor

    add_doctor(sub)
    from services.common.models import add_models_command

    add_models_command(sub)
    from services.loadtest.cli import add_loadtest_command

    add_loadtest_command(sub)
    from services.plan.cli import add_plan_command

    add_plan_command(sub)
    args, rest = parser.parse_known_args(argv)
    if args.func is None:
        run_service(args.service, rest)
        return
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.func(args)


if __name__ == "__main__":
    main()
