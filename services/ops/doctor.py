"""`voice-agent doctor`: can this host serve? GPUs, models, end of turn, Redis, ports, nginx.

Each check says OK, WARN or FAIL, and what to do about anything that is not OK; the
exit status is 1 when one FAILs. Settings are read as the services read them, from
the environment, after the site's environment file (by default
/etc/voice-agent/voice-agent.env, when it exists) fills in what the environment
leaves unset.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from services.asr.settings import AsrSettings
from services.common.service.settings import BaseServiceSettings, settings_problem
from services.duplex.settings import DuplexSettings
from services.gateway.settings import GatewaySettings
from services.ops.deploy import NginxSite
from services.ops.doctor_checks import (
    Check,
    check_asr_model,
    check_duplex_model,
    check_end_of_turn,
    check_gpus,
    check_nginx_config,
    check_port,
    check_redis,
    check_tts_model,
)
from services.ops.registry import load_settings, server_section, up_services
from services.tts.settings import TtsSettings

DEFAULT_ENV_FILE = Path("/etc/voice-agent/voice-agent.env")


@dataclass(frozen=True)
class Options:
    """What to check beyond the settings."""

    gateway_ports: tuple[int, ...] = ()
    """Gateway processes on this host (default: the settings' one port)."""
    tls_cert: Path = NginxSite.tls_cert
    tls_key: Path = NginxSite.tls_key
    nginx_conf: Path | None = None
    """A rendered nginx.conf to test instead of rendering the template."""
    tts_venv: Path | None = None
    """The TTS service's own environment (chatterbox lives there)."""


def load_env_file(path: Path, environ: MutableMapping[str, str]) -> None:
    """`KEY=value` lines (systemd EnvironmentFile style) for keys `environ` lacks."""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")) or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        environ.setdefault(key.strip(), value)


def run_checks(options: Options) -> list[Check]:
    """Every check of what `voice-agent up` starts with these settings (the cascade, or the
    duplex service and its gateway: `up_services`), in the order an operator fixes things."""
    try:
        loaded = {name: load_settings(name) for name in up_services()}
    except ValidationError as exc:
        return [Check("settings", "FAIL", settings_problem(exc), "fix the VA_... variables named")]
    gateway = loaded["gateway"]
    assert isinstance(gateway, GatewaySettings)
    engines = [settings for name, settings in loaded.items() if name != "gateway"]
    checks = [check_gpus(*engines)]
    for settings in engines:
        if isinstance(settings, AsrSettings):
            checks.append(check_asr_model(settings))
        elif isinstance(settings, TtsSettings):
            checks.append(check_tts_model(settings, options.tts_venv))
        elif isinstance(settings, DuplexSettings):
            checks.append(check_duplex_model(settings))
    if gateway.gateway.backend == "cascade":  # the duplex model ends its own turns
        checks.append(check_end_of_turn(gateway.gateway))
    checks.append(check_redis(gateway.redis.url))
    for name, settings in loaded.items():
        if name != "gateway":
            server = server_section(settings, name)
            checks.append(check_port(name, server.host, server.port))
    ports = options.gateway_ports or (gateway.gateway.server.port,)
    checks += [check_port("gateway", gateway.gateway.server.host, port) for port in ports]
    checks.append(check_nginx_config(_site(loaded, ports, options), options.nginx_conf))
    return checks


def _site(
    loaded: Mapping[str, BaseServiceSettings], ports: tuple[int, ...], options: Options
) -> NginxSite:
    """The nginx site in front of these services (the template's defaults for those `up`
    does not start)."""

    def upstream(name: str, default: Sequence[str]) -> Sequence[str]:
        if name not in loaded:
            return default
        return (f"127.0.0.1:{server_section(loaded[name], name).port}",)

    return NginxSite(
        gateways=tuple(f"127.0.0.1:{port}" for port in ports),
        asr=upstream("asr", NginxSite.asr),
        tts=upstream("tts", NginxSite.tts),
        tls_cert=options.tls_cert,
        tls_key=options.tls_key,
    )


def report(checks: list[Check]) -> str:
    """The checks as aligned lines, each non-OK one followed by its fix, and a tally."""
    lines = []
    for check in checks:
        lines.append(f"{check.status:<5} {check.name:<13} {check.detail}")
        if check.fix and check.status != "OK":
            lines.append(f"{'':<19} fix: {check.fix}")
    tally = {status: sum(c.status == status for c in checks) for status in ("FAIL", "WARN", "OK")}
    lines.append(", ".join(f"{n} {status}" for status, n in tally.items()))
    return "\n".join(lines)


def ports_list(text: str) -> tuple[int, ...]:
    """An argparse type: comma-separated TCP ports (`8000,8010`)."""
    try:
        ports = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not a comma-separated list of ports") from None
    if not ports or not all(1 <= port <= 65535 for port in ports):
        raise argparse.ArgumentTypeError(f"{text!r}: ports run from 1 to 65535")
    return ports


def run_cli(args: argparse.Namespace) -> None:
    """`voice-agent doctor`: print the checks; exit 1 if any FAILs (2: a bad argument)."""
    env_file = args.env_file
    if env_file is None and DEFAULT_ENV_FILE.is_file():
        env_file = DEFAULT_ENV_FILE
    if env_file:
        try:
            load_env_file(Path(env_file), os.environ)
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not a text file"
            print(f"voice-agent doctor: error: cannot read {env_file}: {reason}", file=sys.stderr)
            raise SystemExit(2) from None
    ports = args.gateway_ports or ()
    options = Options(ports, args.tls_cert, args.tls_key, args.nginx_conf, args.tts_venv)
    checks = run_checks(options)
    if args.json:
        print(json.dumps([asdict(check) for check in checks], indent=2))
    else:
        print(report(checks))
    if any(check.status == "FAIL" for check in checks):
        raise SystemExit(1)


def add_parser(sub: Any) -> None:
    """Register `doctor` on the `voice-agent` subcommands."""
    parser = sub.add_parser(
        "doctor", help="check GPUs, models, end of turn, Redis, ports and nginx"
    )
    parser.add_argument("--env-file", help=f"site settings to read (default: {DEFAULT_ENV_FILE})")
    parser.add_argument(
        "--gateway-ports", type=ports_list, help="comma-separated ports of the gateway processes"
    )
    parser.add_argument("--tls-cert", type=Path, default=NginxSite.tls_cert)
    parser.add_argument("--tls-key", type=Path, default=NginxSite.tls_key)
    parser.add_argument("--nginx-conf", type=Path, help="test this nginx.conf instead")
    parser.add_argument("--tts-venv", type=Path, help="the TTS service's Python environment")
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    parser.set_defaults(func=run_cli)
