"""Start the lite stack as real processes (as `voice-agent up` does) for benchmarks."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from services.ops.cli import wait_ready
from services.ops.redis_server import free_port, start_redis


@contextmanager
def lite_stack(
    extra_env: dict[str, str] | None = None, cpus: dict[str, set[int]] | None = None
) -> Iterator[dict[str, str]]:
    """Redis + ASR + TTS + gateway on free ports; yields their base URLs.

    `cpus` pins services to cores by name ("redis", "asr", "tts", "gateway").
    """
    cpus = cpus or {}
    workdir = Path(tempfile.mkdtemp(prefix="va-bench-"))
    redis_port = free_port()
    redis = start_redis(redis_port, workdir)
    if "redis" in cpus:
        os.sched_setaffinity(redis.pid, cpus["redis"])
    ports = {"asr": free_port(), "tts": free_port(), "gateway": free_port()}
    env = {
        **os.environ,
        "VA_REDIS__URL": f"redis://127.0.0.1:{redis_port}/0",
        "VA_AUTH__REQUIRED": "false",  # loopback only, as `voice-agent up` runs it
        **(extra_env or {}),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", f"services.{name}.server", "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(workdir / f"{name}.log", "wb"),  # noqa: SIM115
            preexec_fn=_pin(cpus.get(name)),
        )
        for name, port in ports.items()
    ]
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    try:
        wait_ready(urls, procs, 120, logs=f"the logs in {workdir}")
        yield urls
    finally:
        for proc in [*procs, redis]:
            proc.terminate()
        for proc in [*procs, redis]:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _pin(cores: set[int] | None) -> Callable[[], None] | None:
    if not cores:
        return None
    return lambda: os.sched_setaffinity(0, cores)
