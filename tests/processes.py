"""Services as real processes (`python -m services.<name>.server`) on fixed ports, that a
test or a drill can signal, kill and start again on the same port.

A thread (tests/servers.py) cannot be sent SIGTERM or be killed -9; a process can. Used by
tests/e2e/test_sigterm.py, benchmarks/stack.py and benchmarks/fault_drill.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from services.ops.cli import wait_ready
from services.ops.redis_server import free_port

ROOT = Path(__file__).resolve().parents[1]


class ServiceProcess:
    """One service process; `start` again after it stopped reuses its port and its log."""

    def __init__(
        self,
        name: str,
        env: Mapping[str, str],
        logs: Path,
        port: int | None = None,
        cpus: set[int] | None = None,
    ) -> None:
        self.name = name
        self.port = port or free_port()
        self.env = dict(env)
        self.log_path = logs / f"{name}-{self.port}.log"
        self.cpus = cpus
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def start(self, wait_s: float = 120.0) -> None:
        """Start it and wait until it answers /ready (SystemExit when it does not)."""
        self.spawn()
        assert self.proc is not None
        wait_ready({self.name: self.http}, [self.proc], wait_s, logs=str(self.log_path))

    def spawn(self) -> None:
        """Start it without waiting."""
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [sys.executable, "-m", f"services.{self.name}.server", "--port", str(self.port)],
                cwd=ROOT,
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=log,
                preexec_fn=_pin(self.cpus),
            )

    def send(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def wait(self, timeout_s: float) -> int:
        """Its exit status once it exits (TimeoutExpired when it does not in time)."""
        assert self.proc is not None
        return self.proc.wait(timeout_s)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM, and SIGKILL if it is not gone in `timeout_s`."""
        if not self.running():
            return
        self.send(signal.SIGTERM)
        try:
            self.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.send(signal.SIGKILL)
            self.wait(10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@contextlib.contextmanager
def running(*services: ServiceProcess, wait_s: float = 120.0) -> Iterator[None]:
    """Start the services together (they load in parallel), stop them all at the end."""
    try:
        for service in services:
            service.spawn()
        procs = [s.proc for s in services if s.proc is not None]
        urls = {f"{s.name}:{s.port}": s.http for s in services}
        wait_ready(urls, procs, wait_s, logs=", ".join(str(s.log_path) for s in services))
        yield
    finally:
        for service in services:
            if service.running():
                service.send(signal.SIGTERM)
        for service in services:
            service.stop()


def _pin(cores: set[int] | None) -> Callable[[], None] | None:
    if not cores:
        return None
    return lambda: os.sched_setaffinity(0, cores)
