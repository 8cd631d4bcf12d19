"""Start the lite stack as real processes (as `voice-agent up` does) for benchmarks, and
(ProcessStack) keep hold of each so a drill can kill, freeze and restart it."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from services.ops.redis_server import free_port, start_redis
from tests.processes import ServiceProcess, running

SERVICE_NAMES = ("asr", "tts", "gateway")


class ProcessStack:
    """Redis + ASR + TTS + gateway, each its own process on its own port.

    `cpus` pins processes to cores by name ("redis", "asr", "tts", "gateway").
    """

    def __init__(
        self,
        extra_env: dict[str, str] | None = None,
        cpus: dict[str, set[int]] | None = None,
        workdir: Path | None = None,
    ) -> None:
        self.cpus = cpus or {}
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="va-bench-"))
        self.redis_port = free_port()
        self.redis: subprocess.Popen[bytes] | None = None
        self.redis_starts = 0
        env = {
            **os.environ,
            "VA_REDIS__URL": self.redis_url,
            "VA_AUTH__REQUIRED": "false",  # loopback only, as `voice-agent up` runs it
            **(extra_env or {}),
        }
        self.services = {
            name: ServiceProcess(name, env, self.workdir, cpus=self.cpus.get(name))
            for name in SERVICE_NAMES
        }

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    @property
    def urls(self) -> dict[str, str]:
        return {name: service.http for name, service in self.services.items()}

    def start_redis(self) -> None:
        """Start (or start again, empty: it keeps nothing on disk) the stack's Redis."""
        self.redis_starts += 1
        self.redis = start_redis(self.redis_port, self.workdir / f"redis-{self.redis_starts}")
        if "redis" in self.cpus:
            os.sched_setaffinity(self.redis.pid, self.cpus["redis"])

    def signal_redis(self, signum: int) -> None:
        assert self.redis is not None
        self.redis.send_signal(signum)
        if signum == signal.SIGKILL:
            self.redis.wait(10)

    @contextmanager
    def running(self) -> Iterator[ProcessStack]:
        """Everything started and ready; everything stopped at the end."""
        self.start_redis()
        try:
            with running(*self.services.values()):
                yield self
        finally:
            if self.redis is not None:
                self.redis.send_signal(signal.SIGCONT)  # a drill may have frozen it
                self.redis.terminate()
                try:
                    self.redis.wait(30)
                except subprocess.TimeoutExpired:
                    self.redis.kill()
                    self.redis.wait(10)


@contextmanager
def lite_stack(
    extra_env: dict[str, str] | None = None, cpus: dict[str, set[int]] | None = None
) -> Iterator[dict[str, str]]:
    """Redis + ASR + TTS + gateway on free ports; yields their base URLs."""
    with ProcessStack(extra_env, cpus).running() as stack:
        yield stack.urls
