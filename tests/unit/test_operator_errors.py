"""Operator commands answer an ordinary mistake with one line naming it, never a traceback:
exit 2 for a bad argument or file given, 1 for a service that does not answer (the CLI's
convention)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from services.ops import deploy, doctor
from services.ops.cli import main
from services.ops.redis_server import free_port


@dataclass(frozen=True)
class Case:
    argv: tuple[str, ...]
    """The command (`deploy ...`: python -m services.ops.deploy); {tmp} is a fresh folder."""
    status: int
    line: str
    """How the line naming the mistake starts (on stdout for doctor's FAIL checks)."""
    env: tuple[tuple[str, str], ...] = ()
    afile: bool = False
    """Make {tmp}/afile, a file."""
    unreadable: bool = False
    """Reading the env file fails as it does without the permission (tests run as root)."""


def refused(path: Path, environ: object) -> None:
    raise PermissionError(13, "Permission denied", str(path))


REDIS_DOWN = (("VA_REDIS__URL", "redis://127.0.0.1:{port}/0"),)
CASES = {
    "keys list, Redis down": Case(
        ("keys", "list"), 1, "voice-agent keys list: cannot reach Redis (", REDIS_DOWN
    ),
    "keys create, a negative limit": Case(
        ("keys", "create", "--tenant", "ok", "--sessions", "-1"),
        2,
        "voice-agent keys create: error: argument --sessions: '-1': Input should be greater",
    ),
    "doctor, no such env file": Case(
        ("doctor", "--env-file", "{tmp}/missing.env"),
        2,
        "voice-agent doctor: error: cannot read {tmp}/missing.env: No such file or directory",
    ),
    "doctor, an env file that is a folder": Case(
        ("doctor", "--env-file", "{tmp}"),
        2,
        "voice-agent doctor: error: cannot read {tmp}: Is a directory",
    ),
    "doctor, an unreadable env file": Case(
        ("doctor", "--env-file", "{tmp}/va.env"),
        2,
        "voice-agent doctor: error: cannot read {tmp}/va.env: Permission denied",
        unreadable=True,
    ),
    "doctor, a port that is no number": Case(
        ("doctor", "--env-file", "", "--gateway-ports", "8000,abc"),
        2,
        "voice-agent doctor: error: argument --gateway-ports: '8000,abc': not a comma-separated",
    ),
    "doctor, a Redis URL of another scheme": Case(
        ("doctor", "--env-file", ""),
        1,  # a FAIL among the checks
        "FAIL  redis         VA_REDIS__URL http://foo: unsupported Redis URL scheme 'http'",
        (("VA_REDIS__URL", "http://foo"),),
    ),
    "models pull into a file": Case(
        ("models", "pull", "smart-turn", "--dir", "{tmp}/afile"),
        1,
        "voice-agent models pull: error: --dir {tmp}/afile: {tmp}/afile is a file, not a folder",
        afile=True,
    ),
    "nginx, a WebSocket timeout under the ping interval": Case(
        ("deploy", "nginx", "--ws-timeout-s", "5"),
        2,
        "python -m services.ops.deploy nginx: error: --ws-timeout-s must exceed the 20 s",
    ),
    "nginx, a gateway that is no address": Case(
        ("deploy", "nginx", "--gateway", "bad addr"),
        2,
        "python -m services.ops.deploy nginx: error: not a host[:port] address for gateway",
    ),
    "nginx, --out in a missing folder": Case(
        ("deploy", "nginx", "--out", "{tmp}/missing/nginx.conf"),
        2,
        "python -m services.ops.deploy nginx: error: {tmp}/missing/nginx.conf: No such file",
    ),
}


def run(argv: list[str]) -> int:
    """The command in this process, its exit status as the interpreter would give it (a
    SystemExit carrying a message prints it to stderr and exits 1)."""
    command = deploy.main if argv[0] == "deploy" else main
    try:
        command(argv[1:] if argv[0] == "deploy" else argv)
    except SystemExit as exited:
        if isinstance(exited.code, str):
            print(exited.code, file=sys.stderr)
            return 1
        return exited.code or 0
    return 0


@pytest.mark.parametrize("name", list(CASES))
def test_an_ordinary_mistake_is_one_line(
    name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    case = CASES[name]
    values = {"tmp": str(tmp_path), "port": str(free_port())}
    for variable in ("VA_REDIS__URL", "VA_LOG_LEVEL"):  # what an env file might have set
        monkeypatch.delenv(variable, raising=False)
    for variable, value in case.env:
        monkeypatch.setenv(variable, value.format(**values))
    if case.afile:
        (tmp_path / "afile").write_text("not a folder")
    if case.unreadable:
        monkeypatch.setattr(doctor, "load_env_file", refused)
    assert run([arg.format(**values) for arg in case.argv]) == case.status
    out, err = capsys.readouterr()
    expected = case.line.format(**values)
    said = out if case.line.startswith("FAIL") else err
    assert any(line.startswith(expected) for line in said.splitlines()), (expected, out, err)
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if not line.startswith((" ", "usage:"))]
    assert len(lines) <= 1, err  # argparse's usage lines aside
