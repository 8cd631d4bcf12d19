"""`voice-agent healthcheck`: exit 0 when the service this container runs answers `/ready`.

The container images' HEALTHCHECK (and compose.yaml's) run it as
`python -m services.ops.healthcheck`: one image serves every service, chosen by its
command, so the check reads that command from the container's first process
(`/proc/1/cmdline`: `voice-agent gateway --port 9000`, also behind an init such as
`catatonit -- voice-agent asr`), and the port from `--port` there or from the service's
settings (`VA_GATEWAY__SERVER__PORT`, ...), which the check inherits from the container's
environment. `voice-agent up` counts as ready when its services are (the cascade's three, or
the duplex service and the gateway). `--service` and
`--url` say it outright where there is no such process to read.

Kept light (the standard library's HTTP client, no CLI tree): Docker and podman run it every
few seconds.
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

from services.ops.registry import SERVICES, load_settings, server_section, up_services

CMDLINE: Final = Path("/proc/1/cmdline")
WILDCARD: Final = frozenset({"0.0.0.0", "::", ""})


class HealthcheckError(Exception):
    """What the check could not find out; the message says why."""


def command_of(argv: Sequence[str]) -> tuple[str, list[str]]:
    """The service a command line runs and the arguments after it.

    `voice-agent asr --port 9`, `python -m services.tts.server`, `catatonit -- voice-agent up`.
    """
    names = (*SERVICES, "up")
    for i, word in enumerate(argv):
        if word in names and i > 0 and Path(argv[i - 1]).name == "voice-agent":
            return word, list(argv[i + 1 :])
        for name in SERVICES:
            if word == f"services.{name}.server" or word.endswith(f"services/{name}/server.py"):
                return name, list(argv[i + 1 :])
    # (the program's name only: a command line may carry secrets)
    program = Path(argv[0]).name if argv else "nothing"
    raise HealthcheckError(f"PID 1 ({program}) runs no voice-agent service: pass --service")


def _option(args: Sequence[str], flag: str) -> str | None:
    for i, word in enumerate(args):
        if word == flag and i + 1 < len(args):
            return args[i + 1]
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
    return None


def reachable_host(host: str) -> str:
    """Where a process on this machine reaches a server bound to `host` (a wildcard: loopback)."""
    return "127.0.0.1" if host in WILDCARD else host


def host_port(host: str, port: int | str) -> str:
    """`host:port` as a URL writes it (an IPv6 host in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def ready_url(service: str, args: Sequence[str] = ()) -> str:
    """`/ready` of `service` as started with `args` (`--host`, `--port`) and its settings."""
    server = server_section(load_settings(service), service)
    host = _option(args, "--host") or server.host
    port = _option(args, "--port") or str(server.port)
    return f"http://{host_port(reachable_host(host), port)}/ready"


def targets(service: str | None, url: str | None, cmdline: Path = CMDLINE) -> list[str]:
    """The `/ready` URLs to check."""
    if url:
        base = url.rstrip("/")
        return [base if base.endswith("/ready") else base + "/ready"]
    if service is None:
        try:
            argv = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError as exc:
            raise HealthcheckError(f"cannot read {cmdline}: {exc}; pass --service") from None
        service, args = command_of([word for word in argv if word])
    else:
        args = []
    if service == "up":
        return [ready_url(name) for name in up_services()]
    if service not in SERVICES:
        raise HealthcheckError(f"unknown service {service!r}: one of {', '.join(SERVICES)}")
    return [ready_url(service, args)]


def probe(url: str, timeout_s: float) -> str | None:
    """None when `url` answers 200, else why not. Straight there: a proxy of the
    environment (HTTP_PROXY) cannot reach the container's own ports."""
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with direct.open(url, timeout=timeout_s) as reply:
            return None if reply.status == 200 else f"{url}: HTTP {reply.status}"
    except urllib.error.HTTPError as exc:
        return f"{url}: HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return f"{url}: {getattr(exc, 'reason', exc)}"
    except ValueError as exc:  # a URL urllib cannot take apart (`http://[::1`)
        return f"{url}: {exc}"


def add_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--service", choices=[*SERVICES, "up"], help="default: PID 1's command")
    parser.add_argument("--url", help="the service's base URL (default: from its settings)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds per request")
    return parser


def run(args: argparse.Namespace) -> int:
    """0 when every target answers `/ready` with 200; 1 (and why, on stderr) otherwise."""
    if args.url and not args.url.startswith(("http://", "https://")):
        print(f"healthcheck: --url must be http:// or https://: {args.url!r}", file=sys.stderr)
        return 1
    try:
        _ = urlsplit(args.url or "").port  # raises for a URL that is not one (`http://[::1`)
    except ValueError as exc:
        print(f"healthcheck: --url {args.url!r}: {exc}", file=sys.stderr)
        return 1
    try:
        urls = targets(args.service, args.url)
    except (HealthcheckError, ValueError) as exc:
        print(f"healthcheck: {exc}", file=sys.stderr)
        return 1
    problems = [problem for url in urls if (problem := probe(url, args.timeout))]
    for problem in problems:
        print(f"healthcheck: not ready: {problem}", file=sys.stderr)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> None:
    parser = add_parser(argparse.ArgumentParser(prog="voice-agent healthcheck"))
    raise SystemExit(run(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
