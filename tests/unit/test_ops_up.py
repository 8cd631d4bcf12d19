"""`voice-agent up`: the Redis it starts (only one that can stand in for VA_REDIS__URL, its
password never printed), one line for a bad URL or state folder, IPv6 hosts, and how it
stops: on SIGHUP too, the services before Redis, and a second Ctrl-C that still kills what
is left. The services and Redis are stand-ins that record what is done to them."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from services.common.bus.connection import parse_url
from services.ops import cli
from services.ops.redis_server import free_port

Event = tuple[str, str]


class Proc:
    """A started process: it stops when told to, and logs what was done to it."""

    def __init__(self, name: str, log: list[Event], interrupted_waits: int = 0) -> None:
        self.name = name
        self.log = log
        self.args = [sys.executable, "-m", name]
        self.returncode: int | None = None
        self.interrupted_waits = interrupted_waits
        """Waits that a Ctrl-C interrupts (a second Ctrl-C while `up` stops)."""

    def poll(self) -> int | None:
        return self.returncode

    def terminate(self) -> None:
        self.log.append(("terminate", self.name))

    def kill(self) -> None:
        self.log.append(("kill", self.name))
        self.returncode = -9

    def wait(self, timeout: float | None = None) -> int:
        if self.interrupted_waits:
            self.interrupted_waits -= 1
            raise KeyboardInterrupt
        if self.returncode is None:
            self.returncode = -15
            self.log.append(("exited", self.name))
        return self.returncode


@dataclass
class Up:
    """`voice-agent up` with stand-ins for its processes, Ctrl-C pressed once all started."""

    monkeypatch: pytest.MonkeyPatch
    state_dir: Path
    log: list[Event] = field(default_factory=list)
    redis_ports: list[int] = field(default_factory=list)
    signals: dict[int, Callable[..., object]] = field(default_factory=dict)
    services: list[Proc] = field(default_factory=list)
    stubborn: str = ""
    """The service whose stop a second Ctrl-C interrupts."""

    def start_redis(self, port: int, workdir: Path, own_session: bool = False) -> Proc:
        self.redis_ports.append(port)
        self.redis = Proc("redis", self.log)
        return self.redis

    def popen(self, args: list[str], **_: object) -> Proc:
        name = args[-1]
        stubborn = bool(self.stubborn) and self.stubborn in name
        self.services.append(Proc(name, self.log, interrupted_waits=int(stubborn)))
        return self.services[-1]

    def run(self, redis_url: str, *more: str) -> int | str | None:
        """`up` to its end (after Ctrl-C): None for a normal end, else the exit's code."""
        self.monkeypatch.setenv("VA_REDIS__URL", redis_url)
        try:
            cli.main(["up", "--state-dir", str(self.state_dir), *more])
        except SystemExit as exited:
            return exited.code
        except KeyboardInterrupt:
            pytest.fail("a Ctrl-C came out of `up` as KeyboardInterrupt (a traceback)")
        return None


def ctrl_c(*_: object, **__: object) -> None:
    raise KeyboardInterrupt


@pytest.fixture
def up(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Up:
    fake = Up(monkeypatch, tmp_path / "var")
    for service in ("ASR", "TTS", "GATEWAY"):
        monkeypatch.setenv(f"VA_{service}__SERVER__PORT", str(free_port()))
    for variable in ("VA_PROFILE", "VA_GATEWAY__BACKEND", "VA_AUTH__REQUIRED"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(signal, "signal", fake.signals.__setitem__)  # the test's own stay
    monkeypatch.setattr(cli, "start_redis", fake.start_redis)
    monkeypatch.setattr(cli.subprocess, "Popen", fake.popen)
    monkeypatch.setattr(cli, "wait_ready", ctrl_c)  # Ctrl-C once everything started
    return fake


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_a_local_redis_is_started_and_stopped_after_the_services(up: Up, host: str) -> None:
    port = free_port()
    assert up.run(f"redis://{host}:{port}/0") is None
    assert up.redis_ports == [port]
    stopped = up.log.index(("terminate", "redis"))
    assert {name for _, name in up.log[:stopped]} == {p.name for p in up.services}
    assert all(("exited", p.name) in up.log[:stopped] for p in up.services), up.log


@pytest.mark.parametrize(
    "url",
    [
        "redis://:s3cretPW@127.0.0.1:{port}/0",  # a Redis of ours would not know the password
        "redis://user:s3cretPW@localhost:{port}/0",
        "rediss://127.0.0.1:{port}/0",  # TLS
        "redis://127.0.0.2:{port}/0",  # not where ours listens
        "redis+sentinel://:s3cretPW@127.0.0.1:{port}/mymaster/0",
    ],
)
def test_no_redis_is_started_for_one_that_is_not_ours_to_stand_in_for(
    up: Up, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = up.run(url.format(port=free_port()))
    out, err = capsys.readouterr()
    assert up.redis_ports == [] and up.services == []
    assert isinstance(code, str) and code.startswith("voice-agent up: no Redis answers at ")
    assert "\n" not in code
    assert "s3cretPW" not in code + out + err


def test_a_bad_redis_url_is_one_line_without_its_password(
    up: Up, capsys: pytest.CaptureFixture[str]
) -> None:
    assert up.run("redis+cluster://:s3cretPW@/") == 2
    out, err = capsys.readouterr()
    expected = "voice-agent up: bad setting: VA_REDIS__URL redis+cluster://***@/: no hosts in"
    assert err.startswith(expected) and len(err.splitlines()) == 1, err
    assert "s3cretPW" not in out + err and up.redis_ports == []


def test_a_state_dir_that_is_a_file_is_one_line(
    up: Up, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.undo()  # the real start_redis, which makes its folder first
    monkeypatch.setattr(signal, "signal", up.signals.__setitem__)
    for service in ("ASR", "TTS", "GATEWAY"):
        monkeypatch.setenv(f"VA_{service}__SERVER__PORT", str(free_port()))
    up.state_dir.write_text("a file")
    code = up.run(f"redis://127.0.0.1:{free_port()}/0")
    folder = up.state_dir.resolve() / "redis"
    expected = f"voice-agent up: --state-dir {up.state_dir}: cannot use {folder}: Not a directory"
    assert code == expected


def test_sighup_stops_it_as_sigterm_does(up: Up) -> None:
    assert up.run(f"redis://127.0.0.1:{free_port()}/0") is None
    assert up.signals[signal.SIGHUP] is up.signals[signal.SIGTERM]
    with pytest.raises(KeyboardInterrupt):
        up.signals[signal.SIGHUP](signal.SIGHUP, None)


def test_a_second_ctrl_c_while_stopping_kills_what_is_left(up: Up) -> None:
    up.stubborn = "gateway"
    assert up.run(f"redis://127.0.0.1:{free_port()}/0") is None  # no traceback
    assert ("kill", "services.gateway.server") in up.log and ("kill", "redis") in up.log
    assert all(p.returncode is not None for p in [*up.services, up.redis])
    assert up.signals[signal.SIGINT] == signal.SIG_IGN  # a third one cannot cut it short


def test_ipv6_hosts_are_bracketed(up: Up, monkeypatch: pytest.MonkeyPatch) -> None:
    for service in ("ASR", "TTS", "GATEWAY"):
        monkeypatch.setenv(f"VA_{service}__SERVER__HOST", "::1")
    port = free_port()
    monkeypatch.setenv("VA_GATEWAY__SERVER__PORT", str(port))
    assert cli._service_urls()["gateway"] == f"http://[::1]:{port}"
    assert up.run("redis+cluster://:s3cretPW@/") == 2  # past the port check, no ValueError


@pytest.mark.parametrize(
    "url",
    ["redis+cluster://:s3cretPW@/", "redis+sentinel://:s3cretPW@h1:26379/", "u:s3cretPW@h1:6379"],
)
def test_a_refused_redis_url_is_not_repeated_with_its_password(url: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_url(url)
    assert "s3cretPW" not in str(refused.value)
