"""`voice-agent`: one command line over every service and operator tool.

voice-agent up                       Redis (if none) + ASR + TTS + gateway, until Ctrl-C
                                     (VA_PROFILE=duplex: + the duplex service + gateway)
voice-agent asr|tts|gateway [--port] one service
voice-agent duplex [--port]          the full-duplex (Moshi) service, from .venv-duplex
voice-agent client --wav FILE        talk to the agent with a wav file
voice-agent keys create|list|revoke  API keys (authentication; docs/auth.md)
voice-agent doctor                   check GPUs, models, Redis, ports and nginx
voice-agent models pull NAME [--dir] download model weights (models list: the names)
voice-agent loadtest --sessions 1,5,10 simulated users against /v1/stream; JSON + plots
voice-agent plan [FILES]             a capacity plan from measurement files
voice-agent drain [--url]            drain a local gateway (the Kubernetes preStop hook)
voice-agent healthcheck              the container's service answers /ready (HEALTHCHECK)

Every module this imports needs only the default install; a sub-command that needs an
optional extra checks for it when it runs and exits 2 naming the `pip install` to run.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
from pydantic import ValidationError

from services.common.auth.credentials import is_loopback
from services.common.platform.extras import MissingExtra
from services.common.redact import redact, redact_url
from services.common.service.settings import settings_problem
from services.loadtest.cli import add_loadtest_command
from services.ops.doctor import add_parser as add_doctor_command
from services.ops.doctor_checks import duplex_python
from services.ops.healthcheck import add_parser as add_healthcheck_arguments
from services.ops.healthcheck import host_port, reachable_host
from services.ops.healthcheck import run as healthcheck_run
from services.ops.keys import add_keys_command
from services.ops.models import add_models_command
from services.ops.redis_server import reachable, start_redis
from services.ops.registry import SERVICES, load_settings, server_section, up_services
from services.plan.cli import add_plan_command

STARTUP_TIMEOUT_S = 120.0


def wait_ready(
    urls: dict[str, str],
    procs: Sequence[subprocess.Popen[Any]],
    timeout_s: float,
    logs: str = "its log above",
) -> None:
    """Until every service answers /ready; SystemExit when one exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    waiting = dict(urls)
    while waiting and time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                raise SystemExit(f"{_label(proc)} exited with {proc.returncode}; see {logs}")
        for name, url in list(waiting.items()):
            try:
                # trust_env=False: a proxy of the environment (HTTP_PROXY) is no way to loopback
                if httpx.get(f"{url}/ready", timeout=1.0, trust_env=False).status_code == 200:
                    del waiting[name]
            except httpx.HTTPError:
                pass
        time.sleep(0.2)
    if waiting:
        raise SystemExit(f"not ready after {timeout_s:.0f} s: {', '.join(waiting)}; see {logs}")


def _label(proc: subprocess.Popen[Any]) -> str:
    """What a started process is, for a message: its module (`services.gateway.server`), else
    its program."""
    args = [str(arg) for arg in proc.args] if isinstance(proc.args, list) else [str(proc.args)]
    if "-m" in args[:-1]:
        return args[args.index("-m") + 1]
    return Path(args[0]).name


def _ports_in_use(urls: dict[str, str]) -> list[str]:
    """The services whose port already answers (another `voice-agent up`, say), as
    "8000 (gateway: VA_GATEWAY__SERVER__PORT)"."""
    taken = []
    for name, url in urls.items():
        where = urlsplit(url)
        try:
            socket.create_connection((where.hostname, where.port), timeout=1).close()
        except OSError:
            continue
        taken.append(f"{where.port} ({name}: VA_{name.upper()}__SERVER__PORT)")
    return taken


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _python(service: str) -> str:
    """The interpreter a service runs on: the duplex service's own environment (torch) when
    there is one (`make install-duplex`), else this one (enough for its `fake` engine; the
    moshi engines then fail at start-up naming the install)."""
    own = duplex_python() if service == "duplex" else None
    return sys.executable if own is None else str(own)


def _service_urls() -> dict[str, str]:
    """Each service's base URL, from its settings (`VA_<SERVICE>__SERVER__PORT`, ...)."""
    urls = {}
    for name in up_services():
        server = server_section(load_settings(name), name)
        urls[name] = f"http://{host_port(reachable_host(server.host), server.port)}"
    return urls


def _service_env() -> dict[str, str]:
    """The services' environment: authentication off when every service binds loopback
    and the setting is not given (`make run` on a laptop needs no key), else as set."""
    env = dict(os.environ)
    hosts = [server_section(load_settings(name), name).host for name in up_services()]
    if "VA_AUTH__REQUIRED" not in env and all(is_loopback(host) for host in hosts):
        env["VA_AUTH__REQUIRED"] = "false"
        print(
            "authentication is off: every service listens on loopback only "
            "(set VA_AUTH__REQUIRED=true to try keys; see docs/auth.md)",
            flush=True,
        )
    return env


def up(args: argparse.Namespace) -> None:
    """Start everything, print where to connect, stop everything on Ctrl-C, SIGTERM or
    SIGHUP (the terminal closed)."""
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)
    # Ctrl-C stops everything even where `up` was started with SIGINT ignored (a
    # background job of a script inherits that, and Python then keeps ignoring it)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    settings = load_settings("gateway")
    urls = _service_urls()
    procs: list[subprocess.Popen[bytes]] = []
    redis: subprocess.Popen[bytes] | None = None
    try:
        taken = _ports_in_use(urls)
        if taken:
            ports = f"port {taken[0]} is" if len(taken) == 1 else f"ports {', '.join(taken)} are"
            raise SystemExit(
                f"voice-agent up: {ports} in use: is another `voice-agent up` (`make run`) "
                "running? Stop it, or give this one other ports with the settings named"
            )
        redis_port = _redis_to_start(settings.redis.url)
        stack = up_services()
        env = _service_env()
        if redis_port is not None:
            shown = redact_url(settings.redis.url)
            print(f"no Redis at {shown}: starting one on port {redis_port}", flush=True)
            redis = _start_redis(redis_port, Path(args.state_dir))
        if "tts" in urls:  # the gateway lists this TTS service's voices (the page's picker)
            env = {"VA_GATEWAY__TTS_URL": urls["tts"], **env}
        if "duplex" in urls:  # the gateway's sessions are this duplex service's
            env = {"VA_GATEWAY__DUPLEX_URL": urls["duplex"].replace("http://", "ws://"), **env}
        for name, service in stack.items():
            procs.append(subprocess.Popen([_python(name), "-m", service.module], env=env))
        wait_ready(urls, procs, STARTUP_TIMEOUT_S)
        print(_where(urls), flush=True)
        running = procs if redis is None else [*procs, redis]
        while all(proc.poll() is None for proc in running):
            time.sleep(0.5)
        failed = next(proc for proc in running if proc.poll() is not None)
        raise SystemExit(f"{_label(failed)} exited with {failed.returncode}; stopping the others")
    except KeyboardInterrupt:
        pass
    finally:
        _stop(procs, redis)


LOCAL_REDIS_HOSTS = ("127.0.0.1", "localhost")
"""Where `up` may start a Redis of its own (it binds 127.0.0.1)."""


def _redis_to_start(url: str) -> int | None:
    """The port of the Redis `up` starts: None when one answers at `url`. SystemExit when
    `url` is bad, or when nothing answers and it is not a Redis `up` can stand in for (a
    plain redis:// on this host, without credentials): a Redis of its own would not be
    the one the URL means."""
    shown = redact_url(url)
    try:
        if reachable(url):
            return None
        where = urlsplit(url)
        port = where.port or 6379
    except ValueError as exc:
        print(f"voice-agent up: bad setting: VA_REDIS__URL {shown}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    local = where.scheme == "redis" and where.hostname in LOCAL_REDIS_HOSTS
    if not local or where.username or where.password:
        raise SystemExit(
            f"voice-agent up: no Redis answers at {shown} (VA_REDIS__URL): start it, or unset "
            "VA_REDIS__URL (`up` starts a Redis of its own only for redis://127.0.0.1 or "
            "redis://localhost without a password)"
        )
    return port


def _start_redis(port: int, state_dir: Path) -> subprocess.Popen[bytes]:
    """A Redis of `up`'s own, its files under `state_dir`; SystemExit saying why not."""
    try:
        return start_redis(port, state_dir / "redis", own_session=True)
    except OSError as exc:
        if exc.filename is not None:  # the folder: a file in the way, no permission
            problem = f"--state-dir {state_dir}: cannot use {exc.filename}: {exc.strerror}"
            raise SystemExit(f"voice-agent up: {problem}") from None
        raise SystemExit(f"voice-agent up: cannot start Redis: {exc}") from None
    except RuntimeError as exc:  # it started and exited
        raise SystemExit(f"voice-agent up: cannot start Redis: {exc}") from None


def _where(urls: dict[str, str]) -> str:
    """What `up` tells the operator once everything answers."""
    agent = urls["gateway"].replace("http://", "ws://") + "/v1/stream"
    lines = [
        "\nvoice-agent is up:",
        f"  browser    {urls['gateway']}/  (talk to the agent from this page)",
        f"  agent      {agent}  (OpenAI Realtime API: {agent[: -len('/stream')]}/realtime)",
    ]
    if "asr" in urls:
        lines.append(
            f"  ASR        {urls['asr']}  (POST /v1/audio/transcriptions, WS /v1/stream/asr)"
        )
    if "tts" in urls:
        lines.append(f"  TTS        {urls['tts']}  (POST /v1/audio/speech, WS /v1/stream/tts)")
    if "duplex" in urls:
        lines.append(f"  duplex     {urls['duplex']}  (full duplex behind the agent; WS /api/chat)")
    lines.append(f"  try:       voice-agent client --wav your.wav --url {agent}")
    lines.append("  Ctrl-C stops everything.")
    return "\n".join(lines)


def _stop(procs: list[subprocess.Popen[bytes]], redis: subprocess.Popen[bytes] | None) -> None:
    """Stop the services, then Redis (a draining gateway saves its sessions there); kill
    what does not stop in time, and everything still running at a second Ctrl-C."""
    everything = procs if redis is None else [*procs, redis]
    try:
        _terminate(procs)
        if redis is not None:
            _terminate([redis])
    except KeyboardInterrupt:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)  # nothing cuts the killing short
        for proc in everything:
            if proc.poll() is None:
                proc.kill()
        for proc in everything:
            proc.wait()


def _terminate(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to each process still running, then wait for them (30 s each, then SIGKILL)."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def serve(service: str, argv: list[str]) -> None:
    """Run one service in this process (its `server.py`)."""
    importlib.import_module(SERVICES[service].module).main(argv)


def client(args: argparse.Namespace) -> None:
    """Talk to the agent with a wav file."""
    from services.client.credentials import api_key_from_env
    from services.client.stream import talk

    out = Path(args.out) if args.out else None
    if out is not None and (unwritable := _unwritable(out)) is not None:
        print(f"voice-agent client: error: --out {out}: {unwritable}", file=sys.stderr)
        raise SystemExit(2)
    key = api_key_from_env()
    try:
        asyncio.run(talk(args.url, Path(args.wav), out, args.timeout, key))
    except KeyboardInterrupt:
        raise SystemExit(130) from None  # Ctrl-C: the shell's status for SIGINT, no traceback
    except Exception as exc:
        problem = _client_problem(exc, args, key)
        if problem is None:
            raise
        print(f"voice-agent client: error: {redact(problem)}", file=sys.stderr)
        raise SystemExit(1) from None


def _unwritable(out: Path) -> str | None:
    """Why the reply could not be saved at `out` (None when it can): said before the turn."""
    folder = out.parent
    if out.is_dir():
        return "is a folder"
    if not folder.is_dir():
        return f"{folder} is not a folder" if folder.exists() else f"no folder {folder}"
    if not os.access(folder, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        return "permission denied"
    return None


CLOSE_HINTS = {
    1008: "a limit or quota of this tenant (docs/auth.md)",
    1011: "the gateway failed: see its log",
    1012: "the gateway is restarting: try again",
    1013: "the gateway is at capacity: try again later",
}
"""What a close code of the gateway's means to the user (docs/protocol.md)."""


def _closed_problem(exc: Exception, url: str) -> str | None:
    """A session refused, or ended by the gateway, in one line; None for anything else."""
    from services.client.stream import SessionClosed, SessionRefused

    if isinstance(exc, SessionRefused):  # the gateway's own words, when it sent some, say why
        hint = CLOSE_HINTS.get(exc.close_code or 0) if exc.code is None else None
        return f"{exc}; {hint}" if hint else str(exc)
    if not isinstance(exc, SessionClosed):
        return None
    resume = _with_query(url, "session_id", exc.session_id)
    if exc.close_code == 1012:
        return f"{exc}: the gateway is draining; resume the session with --url '{resume}'"
    if exc.close_code == 1011:
        return f"{exc}: the gateway failed (see its log); --url '{resume}' resumes the session"
    hint = CLOSE_HINTS.get(exc.close_code or 0)
    return f"{exc}: {hint}" if hint else str(exc)


def _with_query(url: str, name: str, value: str) -> str:
    """`url` with the query parameter `name` set to `value`."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != name] + [(name, value)]
    return urlunsplit(parts._replace(query=urlencode(query)))


def _client_problem(exc: Exception, args: argparse.Namespace, key: str | None) -> str | None:
    """What a user did wrong (or has not started), in one line; None for a bug."""
    import websockets

    from services.client.credentials import refusal
    from services.client.stream import NoAnswer, ReplyNotSaved
    from services.common.errors import VoiceAgentError

    if (closed := _closed_problem(exc, args.url)) is not None:
        return closed
    if isinstance(exc, ReplyNotSaved):
        return f"--out {exc.path}: {exc.reason}"
    if isinstance(exc, FileNotFoundError | IsADirectoryError | PermissionError):
        return f"cannot read {args.wav}: {exc.strerror}"
    if isinstance(exc, VoiceAgentError):  # the file is not audio
        return f"{args.wav}: {exc.message}"
    if isinstance(exc, websockets.InvalidURI):
        return f"--url {args.url} is not a WebSocket URL: give ws://host:port/v1/stream"
    if (refused := refusal(exc, args.url, key)) is not None:
        return refused
    if isinstance(exc, NoAnswer):
        return (
            f"no complete answer within {args.timeout:g} s: did {args.wav} hold speech? "
            "(--timeout gives the agent longer)"
        )
    if isinstance(exc, OSError):  # refused, unknown host, or a handshake that timed out
        reason = exc.strerror or str(exc) or type(exc).__name__
        return f"cannot reach the gateway at {args.url} ({reason}): is `make run` up?"
    return None


def config(args: argparse.Namespace) -> None:
    """Print every setting (as markdown for the docs)."""
    from services.ops.settings_doc import markdown

    print(markdown())


def drain(args: argparse.Namespace) -> None:
    """Drain the gateway at --url (a loopback address): refuse new sessions, give open ones
    --grace seconds, close the rest with 1012, wait up to --wait for them. Exit 1 if any
    session is still open, or the gateway did not answer."""
    params = {"grace_s": args.grace, "wait_s": args.wait}
    try:
        reply = httpx.post(
            f"{args.url.rstrip('/')}/admin/drain",
            params=params,
            timeout=args.grace + args.wait + 10.0,
            trust_env=False,  # the gateway drains for its own host only, never via a proxy
        )
    except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
        print(f"voice-agent drain: error: --url {args.url}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except httpx.HTTPError as exc:
        print(f"voice-agent drain: error: {exc!r}", file=sys.stderr)
        raise SystemExit(1) from None
    print(reply.text, flush=True)
    if reply.status_code != 200:
        raise SystemExit(1)


def healthcheck(args: argparse.Namespace) -> None:
    """Exit 0 when the service this container runs answers /ready (docs/containers.md)."""
    raise SystemExit(healthcheck_run(args))


def parser() -> argparse.ArgumentParser:
    """The whole command line."""
    top = argparse.ArgumentParser(prog="voice-agent", description=__doc__.split("\n")[0])
    sub = top.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser(
        "up", help="start Redis (if none), ASR, TTS and the gateway (or duplex and the gateway)"
    )
    p_up.add_argument("--state-dir", default="var", help="where a started Redis keeps its files")
    p_up.set_defaults(func=up)
    for service in SERVICES:
        p = sub.add_parser(service, help=f"run the {service} service", add_help=False)
        p.set_defaults(func=None, service=service)
    p_client = sub.add_parser(
        "client",
        help="stream a wav file to /v1/stream (an API key, if needed, in VA_API_KEY)",
    )
    p_client.add_argument(
        "--wav", required=True, help="the speech: a wav file (or flac, mp3, ogg...)"
    )
    p_client.add_argument("--url", default="ws://127.0.0.1:8000/v1/stream")
    p_client.add_argument("--out", default="reply.wav", help="where to save the agent's audio")
    p_client.add_argument("--timeout", type=float, default=30.0)
    p_client.set_defaults(func=client)
    p_config = sub.add_parser("config", help="print every setting, its default and meaning")
    p_config.add_argument("--markdown", action="store_true", help="(the only format for now)")
    p_config.set_defaults(func=config)
    p_drain = sub.add_parser("drain", help="drain a local gateway before it stops")
    p_drain.add_argument("--url", default="http://127.0.0.1:8000", help="the gateway (loopback)")
    p_drain.add_argument("--grace", type=float, default=30.0, help="seconds a turn gets to end")
    p_drain.add_argument("--wait", type=float, default=10.0, help="seconds to wait after 1012")
    p_drain.set_defaults(func=drain)
    p_health = sub.add_parser(
        "healthcheck", help="exit 0 when the service this container runs answers /ready"
    )
    add_healthcheck_arguments(p_health).set_defaults(func=healthcheck)
    add_keys_command(sub)
    add_doctor_command(sub)
    add_models_command(sub)
    add_loadtest_command(sub)
    add_plan_command(sub)
    return top


def main(argv: list[str] | None = None) -> None:
    top = parser()
    args, rest = top.parse_known_args(argv)
    if args.func is None:
        serve(args.service, rest)
        return
    if rest:
        top.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        args.func(args)
    except MissingExtra as exc:
        print(f"voice-agent {args.command}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except ValidationError as exc:  # the settings read from the environment
        print(f"voice-agent {args.command}: bad setting: {settings_problem(exc)}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
