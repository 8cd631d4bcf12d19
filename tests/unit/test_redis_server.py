"""The Redis launcher of `voice-agent up` and the tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.ops.redis_server import free_port, reachable, start_redis


def test_relative_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`make run` passes `var/redis`: redis-server enters its --dir before it opens the log,
    so a relative log path used to point nowhere and the server exited at once."""
    monkeypatch.chdir(tmp_path)
    port = free_port()
    proc = start_redis(port, Path("var/redis"))
    try:
        assert reachable(f"redis://127.0.0.1:{port}/0")
        assert (tmp_path / "var/redis/redis.log").is_file()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
