"""The Redis launcher of `voice-agent up` and the tests."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from services.ops.redis_server import _ephemeral_low, free_port, reachable, reserve, start_redis


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


def test_free_ports_are_never_handed_out_twice_nor_from_the_kernels_own_range() -> None:
    """`bind(0)` gave a port in the range outgoing connections take theirs from (a test's
    client could take it before the server bound it), and could give it twice."""
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert max(ports) < _ephemeral_low()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert not reserve(port)  # in use
    assert reserve(port) and not reserve(port)  # free now, then handed out
