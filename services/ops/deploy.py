"""Render and check the nginx template in deploy/ (systemd units: scripts/install_systemd.sh).

`python -m services.ops.deploy nginx --gateway 127.0.0.1:8000 --gateway 127.0.0.1:8010
--out /etc/nginx/nginx.conf` writes a complete nginx.conf. Templates hold `${UPPER_CASE}`
variables (envsubst style); lower-case `$names` are nginx's own and stay as they are.
"""

from __future__ import annotations

import argparse
import dataclasses
import grp
import os
import pwd
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

DEPLOY_DIR = Path(__file__).resolve().parents[2] / "deploy"
NGINX_TEMPLATE = DEPLOY_DIR / "nginx" / "voice-agent.conf"
WS_PING_INTERVAL_S = 20
"""uvicorn's WebSocket ping interval (common/service/server.py): read timeouts exceed it."""

_VARIABLE = re.compile(r"\$\{([A-Z][A-Z0-9_]*)\}")
_ADDRESS = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(:\d{1,5})?$")
_INDENT = "\n        "


def render(template: str, values: Mapping[str, object]) -> str:
    """`template` with every `${NAME}` replaced; ValueError naming any without a value."""
    missing = sorted({name for name in _VARIABLE.findall(template) if name not in values})
    if missing:
        raise ValueError(f"template variables without a value: {', '.join(missing)}")
    return _VARIABLE.sub(lambda match: str(values[match.group(1)]), template)


def _checked(addresses: Sequence[str], what: str) -> list[str]:
    if not addresses:
        raise ValueError(f"no {what} address given")
    for address in addresses:
        if not _ADDRESS.match(address):
            raise ValueError(f"not a host[:port] address for {what}: {address!r}")
    return list(addresses)


def current_user() -> str:
    """`user group` of this process, for an nginx run without root (tests, checks)."""
    return f"{pwd.getpwuid(os.getuid()).pw_name} {grp.getgrgid(os.getgid()).gr_name}"


@dataclass(frozen=True)
class NginxSite:
    """What the nginx template needs: upstreams, listeners, TLS, limits and paths."""

    gateways: Sequence[str] = ("127.0.0.1:8000",)
    asr: Sequence[str] = ("127.0.0.1:8001",)
    tts: Sequence[str] = ("127.0.0.1:8002",)
    server_name: str = "_"
    bind: Sequence[str] = ("0.0.0.0", "[::]")
    https_port: int = 443
    http_port: int = 80
    tls_cert: Path = Path("/etc/voice-agent/tls/fullchain.pem")
    tls_key: Path = Path("/etc/voice-agent/tls/privkey.pem")
    conn_per_ip: int = 20
    conn_per_server: int = 4000
    token_rate: int = 30
    """POST /v1/sessions per client address per minute (bursts of a tenth of it pass)."""
    ws_timeout_s: int = 3600
    shutdown_timeout_s: int = 60
    max_body_mb: int = 26
    user: str = "www-data"
    worker_processes: str = "auto"
    pid_file: Path = Path("/run/nginx.pid")
    log_dir: Path = Path("/var/log/nginx")
    state_dir: Path = Path("/var/lib/nginx")

    def __post_init__(self) -> None:
        if self.ws_timeout_s <= WS_PING_INTERVAL_S:
            raise ValueError(
                f"ws_timeout_s must exceed the {WS_PING_INTERVAL_S} s WebSocket ping interval"
            )
        if min(self.conn_per_ip, self.conn_per_server, self.max_body_mb, self.token_rate) < 1:
            raise ValueError("connection limits, token_rate and max_body_mb must be at least 1")
        if not re.fullmatch(r"[A-Za-z0-9_.* -]+", self.server_name):
            raise ValueError(f"bad server_name: {self.server_name!r}")

    def sandboxed(self, workdir: Path) -> NginxSite:
        """The same site with its pid, logs and temp files under `workdir`, run as this user."""
        return dataclasses.replace(
            self,
            user=current_user(),
            pid_file=workdir / "nginx.pid",
            log_dir=workdir / "logs",
            state_dir=workdir / "state",
        )

    def values(self) -> dict[str, str]:
        """The template variables."""

        def servers(addresses: Sequence[str], what: str) -> str:
            lines = [f"server {a} max_fails=3 fail_timeout=10s;" for a in _checked(addresses, what)]
            return _INDENT.join(lines)

        binds = _checked(self.bind, "bind")
        return {
            "USER": self.user,
            "WORKER_PROCESSES": self.worker_processes,
            "PID_FILE": str(self.pid_file),
            "LOG_DIR": str(self.log_dir),
            "STATE_DIR": str(self.state_dir),
            "SHUTDOWN_TIMEOUT": f"{self.shutdown_timeout_s}s",
            "GATEWAY_SERVERS": servers(self.gateways, "gateway"),
            "ASR_SERVERS": servers(self.asr, "asr"),
            "TTS_SERVERS": servers(self.tts, "tts"),
            "SERVER_NAME": self.server_name,
            "HTTP_LISTEN": _INDENT.join(f"listen {b}:{self.http_port};" for b in binds),
            "HTTPS_LISTEN": _INDENT.join(f"listen {b}:{self.https_port} ssl;" for b in binds),
            "HTTPS_PORT": str(self.https_port),
            "TLS_CERT": str(self.tls_cert),
            "TLS_KEY": str(self.tls_key),
            "MAX_BODY": f"{self.max_body_mb}m",
            "CONN_PER_IP": str(self.conn_per_ip),
            "CONN_PER_SERVER": str(self.conn_per_server),
            "TOKEN_RATE": str(self.token_rate),
            "TOKEN_BURST": str(max(1, self.token_rate // 10)),
            "WS_TIMEOUT": f"{self.ws_timeout_s}s",
        }


def render_nginx(site: NginxSite, template: Path = NGINX_TEMPLATE) -> str:
    """The nginx.conf for `site`."""
    return render(template.read_text(), site.values())


def prepare_dirs(site: NginxSite) -> None:
    """Create the log and temp folders the rendered config names."""
    site.log_dir.mkdir(parents=True, exist_ok=True)
    site.state_dir.mkdir(parents=True, exist_ok=True)


def nginx_binary() -> str | None:
    """The nginx executable (Debian puts it in /usr/sbin, often not on a user's PATH)."""
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")


def nginx_command(conf: Path, workdir: Path, *extra: str) -> list[str]:
    """`nginx` run on `conf` with its prefix and start-up error log under `workdir`."""
    nginx = nginx_binary()
    if nginx is None:
        raise FileNotFoundError("nginx is not installed (apt-get install nginx)")
    return [nginx, "-p", str(workdir), "-e", str(workdir / "startup.log"), "-c", str(conf), *extra]


def check_nginx(conf: Path, workdir: Path) -> tuple[bool, str]:
    """`nginx -t` on a rendered config: (passed, nginx's own words)."""
    done = subprocess.run(
        nginx_command(conf, workdir, "-t"), capture_output=True, text=True, timeout=30, check=False
    )
    return done.returncode == 0, (done.stderr or done.stdout).strip()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m services.ops.deploy", description=__doc__)
    sub = parser.add_subparsers(dest="what", required=True)
    nginx = sub.add_parser("nginx", help="render deploy/nginx/voice-agent.conf")
    defaults = NginxSite()
    for name in ("gateway", "asr", "tts", "bind"):
        nginx.add_argument(f"--{name}", action="append", help=f"{name} address (repeatable)")
    for field in dataclasses.fields(NginxSite):
        if field.name in ("gateways", "asr", "tts", "bind"):
            continue
        default = getattr(defaults, field.name)
        nginx.add_argument(
            f"--{field.name.replace('_', '-')}",
            type=type(default) if isinstance(default, int | Path) else str,
            default=default,
            help=f"(default: {default})",
        )
    nginx.add_argument("--template", type=Path, default=NGINX_TEMPLATE)
    nginx.add_argument("--out", type=Path, help="write here instead of printing")
    return parser


def main(argv: list[str] | None = None) -> None:
    """Render the nginx config from the command line (a bad option: one line, exit 2)."""
    parser = _parser()
    args = vars(parser.parse_args(argv))
    lists = {"gateways": "gateway", "asr": "asr", "tts": "tts", "bind": "bind"}
    fields = {f.name for f in dataclasses.fields(NginxSite)} - set(lists)
    given: dict[str, Any] = {key: args[key] for key in fields}
    given.update({key: tuple(args[flag]) for key, flag in lists.items() if args[flag]})
    try:
        site = NginxSite(**given)
        text = render_nginx(site, args["template"])
        if args["out"] is not None:
            args["out"].write_text(text)
    except ValueError as exc:  # an option NginxSite refuses (addresses, limits, timeouts)
        _fail(_as_flags(str(exc)))
    except OSError as exc:  # --template to read, --out to write
        _fail(f"{exc.filename}: {exc.strerror or exc}")
    if args["out"] is None:
        print(text, end="")


def _as_flags(message: str) -> str:
    """NginxSite's words for its fields, as the command line's flags (`--ws-timeout-s`)."""
    names = "|".join(f.name for f in dataclasses.fields(NginxSite))
    return re.sub(rf"\b({names})\b", lambda m: "--" + m.group(1).replace("_", "-"), message)


def _fail(message: str) -> NoReturn:
    print(f"python -m services.ops.deploy nginx: error: {message}", file=sys.stderr)
    raise SystemExit(2)


if __name__ == "__main__":
    main()
