"""compose.yaml run by podman, as `docker compose up` runs it: the tests' own compose engine.

Debian's podman 4.3 has no `podman compose`, and podman-compose (PyPI 1.6) skips
`depends_on: condition: service_healthy` on podman 4.3 ("doesn't support healthy"); and
without systemd, podman never runs a healthcheck on its own. So this module reads the
compose files and does what compose does for the part of the Compose specification that
ours use: variable interpolation (`${VAR}`, `${VAR:-default}`, `${VAR:?error}`, `$$`), YAML
merge keys, override files (mappings merge, lists and scalars replace), one network with
the service names as aliases, published ports, named volumes, the hardening options
(`read_only`, `tmpfs`, `cap_drop`, `security_opt`, `init`), `stop_grace_period`, and
`depends_on` conditions: `service_started`, `service_healthy` (the service's own
healthcheck, run with `podman healthcheck run` until it passes or the container exits)
and `service_completed_successfully`. Anything else in a service is an error here, so a
key this runner does not honour cannot pass unnoticed.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

HONOURED = frozenset(
    {
        "image", "build", "command", "environment", "ports", "volumes", "depends_on",
        "healthcheck", "restart", "init", "read_only", "tmpfs", "cap_drop", "security_opt",
        "stop_grace_period", "profiles",
    }
)  # fmt: skip
"""Service keys `up` runs as compose does (`build` and `restart` are the tests' to do: the
image is built by scripts/build_images.sh, and a service that dies must fail the test)."""
_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
    r"|(?P<named>[A-Za-z_][A-Za-z0-9_]*))"
)


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """`text` with compose's variable forms replaced from `env`."""

    def one(match: re.Match[str]) -> str:
        if match.group("escaped"):
            return "$"
        name = match.group("braced") or match.group("named")
        value, op, arg = env.get(name), match.group("op"), match.group("arg") or ""
        unset = value is None or (op is not None and op.startswith(":") and value == "")
        if op in ("-", ":-"):
            return arg if unset else str(value)
        if op in ("?", ":?") and unset:
            raise ValueError(f"required variable {name} is missing: {arg}")
        return "" if value is None else value

    return _VARIABLE.sub(one, text)


def _interpolated(node: Any, env: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [_interpolated(item, env) for item in node]
    if isinstance(node, dict):
        return {key: _interpolated(value, env) for key, value in node.items()}
    return node


def merge(base: Any, over: Any) -> Any:
    """Compose's override rule for what we use: mappings merge, anything else replaces."""
    if isinstance(base, dict) and isinstance(over, dict):
        merged = dict(base)
        for key, value in over.items():
            merged[key] = merge(base[key], value) if key in base else value
        return merged
    return over


def load(files: Sequence[Path], env: Mapping[str, str]) -> dict[str, Any]:
    """The compose model of `files` (the first is the main file), interpolated and merged."""
    model: dict[str, Any] = {}
    for path in files:
        raw = yaml.safe_load(path.read_text())  # SafeLoader resolves `<<` merge keys
        raw = {k: v for k, v in raw.items() if not str(k).startswith("x-")}
        model = merge(model, _interpolated(raw, env))
    return model


def _seconds(value: str | int | float) -> float:
    """A compose duration (`10s`, `1m30s`, `500ms`) in seconds."""
    if isinstance(value, int | float):
        return float(value)
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", value)
    if not parts:
        raise ValueError(f"not a duration: {value!r}")
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(float(n) * scale[unit] for n, unit in parts)


def _environment(value: Mapping[str, Any] | Sequence[str] | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, Mapping):
        return [f"{k}={'' if v is None else v}" for k, v in value.items()]
    return list(value)


@dataclass
class Project:
    """One compose project on podman: `up` in dependency order, `down` in reverse."""

    name: str
    model: dict[str, Any]
    directory: Path
    env: dict[str, str]
    """podman's own environment (CONTAINERS_CONF, ...)."""
    profiles: frozenset[str] = frozenset()
    started: list[str] = field(default_factory=list)

    def podman(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        done = subprocess.run(
            ["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args[:3])}...: {done.stderr[-2000:]}")
        return done.stdout

    def container(self, service: str) -> str:
        return f"{self.name}-{service}-1"

    @property
    def services(self) -> dict[str, dict[str, Any]]:
        """The services of the active profiles."""
        every: dict[str, dict[str, Any]] = self.model["services"]
        return {
            name: svc
            for name, svc in every.items()
            if not svc.get("profiles") or self.profiles & set(svc["profiles"])
        }

    def order(self) -> list[str]:
        """Services with each one after those it depends on."""
        done: list[str] = []

        def visit(name: str, path: tuple[str, ...]) -> None:
            if name in path:
                raise ValueError(f"dependency cycle: {' -> '.join((*path, name))}")
            if name not in done:
                for dep in self.services[name].get("depends_on", {}):
                    visit(dep, (*path, name))
                done.append(name)

        for name in self.services:
            visit(name, ())
        return done

    def run_args(self, name: str) -> list[str]:
        """`podman run` arguments for one service."""
        svc = self.services[name]
        unknown = set(svc) - HONOURED
        if unknown:
            raise ValueError(f"service {name}: keys this runner does not honour: {unknown}")
        args = ["run", "-d", "--name", self.container(name), "--network", f"{self.name}_default"]
        args += ["--network-alias", name, "--label", f"com.docker.compose.project={self.name}"]
        for item in _environment(svc.get("environment")):
            args += ["--env", item]
        for port in svc.get("ports", []):
            args += ["--publish", str(port)]
        for volume in svc.get("volumes", []):
            source, _, rest = str(volume).partition(":")
            if source.startswith((".", "/")):
                source = str((self.directory / source).resolve())
            else:
                source = f"{self.name}_{source}"
            args += ["--volume", f"{source}:{rest}"]
        args += [f"--tmpfs={path}" for path in svc.get("tmpfs", [])]
        args += [f"--cap-drop={cap}" for cap in svc.get("cap_drop", [])]
        args += [f"--security-opt={opt}" for opt in svc.get("security_opt", [])]
        if svc.get("read_only"):
            args.append("--read-only")
        if svc.get("init"):
            args.append("--init")
        if "stop_grace_period" in svc:
            args += ["--stop-timeout", str(round(_seconds(svc["stop_grace_period"])))]
        args += self._healthcheck_args(svc.get("healthcheck"))
        command = svc.get("command")
        args.append(svc["image"])
        if command is not None:
            args += command if isinstance(command, list) else ["sh", "-c", command]
        return args

    @staticmethod
    def _healthcheck_args(check: Mapping[str, Any] | None) -> list[str]:
        if not check:
            return []
        if check.get("disable"):
            return ["--no-healthcheck"]
        test = check["test"]
        if isinstance(test, str):
            cmd = test
        elif test[0] == "CMD":
            cmd = json.dumps(test[1:])
        elif test[0] == "CMD-SHELL":
            cmd = test[1]
        else:
            return ["--no-healthcheck"]
        args = ["--health-cmd", cmd]
        for key in ("interval", "timeout", "start_period"):
            if key in check:
                args += [f"--health-{key.replace('_', '-')}", f"{_seconds(check[key])}s"]
        if "retries" in check:
            args += ["--health-retries", str(check["retries"])]
        return args

    def wait_healthy(self, service: str, deadline: float) -> None:
        """Until the service's healthcheck passes (RuntimeError if it exits or time runs out)."""
        check = self.services[service].get("healthcheck", {})
        poll = _seconds(check.get("start_interval", check.get("interval", "1s")))
        while True:
            ran = subprocess.run(
                ["podman", "healthcheck", "run", self.container(service)],
                env=self.env, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            if ran.returncode == 0:
                return
            state = self.podman("inspect", "--format", "{{.State.Status}}", self.container(service))
            if state.strip() != "running" or time.monotonic() > deadline:
                raise RuntimeError(
                    f"{service} is {state.strip()}, not healthy: {ran.stdout}{ran.stderr}\n"
                    + self.logs(service)[-3000:]
                )
            time.sleep(poll)  # compose polls too: the check itself is the event

    def wait_completed(self, service: str, deadline: float) -> None:
        code = self.podman(
            "wait", self.container(service), timeout=max(1.0, deadline - time.monotonic())
        )
        if code.strip() != "0":
            raise RuntimeError(f"{service} exited {code.strip()}: {self.logs(service)[-3000:]}")

    def up(self, timeout_s: float = 300) -> dict[str, float]:
        """Start every service once its dependencies meet their conditions; return, per
        service, the seconds from the start of `up` to its healthcheck passing."""
        deadline = time.monotonic() + timeout_s
        start = time.monotonic()
        self.podman("network", "create", f"{self.name}_default")
        for volume in self.model.get("volumes") or {}:
            self.podman("volume", "create", f"{self.name}_{volume}")
        healthy: dict[str, float] = {}
        for name in self.order():
            for dep, rule in (self.services[name].get("depends_on") or {}).items():
                condition = rule.get("condition", "service_started")
                if condition == "service_healthy" and dep not in healthy:
                    self.wait_healthy(dep, deadline)
                    healthy[dep] = time.monotonic() - start
                elif condition == "service_completed_successfully":
                    self.wait_completed(dep, deadline)
            self.podman(*self.run_args(name))
            self.started.append(name)
        for name in self.started:
            if name not in healthy and self.services[name].get("healthcheck", {}).get("test"):
                self.wait_healthy(name, deadline)
                healthy[name] = time.monotonic() - start
        return healthy

    def exec(self, service: str, *command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["podman", "exec", self.container(service), *command],
            env=self.env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    def logs(self, service: str) -> str:
        done = subprocess.run(
            ["podman", "logs", self.container(service)],
            env=self.env, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        return done.stdout + done.stderr

    def stop(self) -> dict[str, int]:
        """Stop the services in reverse order (SIGTERM, then the grace period); exit codes."""
        codes = {}
        for name in reversed(self.started):
            self.podman("stop", self.container(name), timeout=120)
            code = self.podman("inspect", "--format", "{{.State.ExitCode}}", self.container(name))
            codes[name] = int(code.strip())
        return codes

    def down(self) -> None:
        """Remove everything `up` made (containers, network, volumes), whatever state it is in."""
        for name in reversed(self.started):
            self.podman("rm", "-f", "-t", "5", self.container(name), check=False)
        self.podman("network", "rm", "-f", f"{self.name}_default", check=False)
        for volume in self.model.get("volumes") or {}:
            self.podman("volume", "rm", "-f", f"{self.name}_{volume}", check=False)
