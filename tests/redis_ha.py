"""Real highly-available Redis deployments for tests and drills, on free local ports.

`SentinelSet`: a master, two replicas and three sentinels. `ClusterSet`: three masters and
three replicas (`redis-cli --cluster create`). Both are context managers that kill every
process they started on the way out, and both can SIGKILL a master and wait for the
promotion (docs/redis-ha.md, "The drill").
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from services.ops.redis_server import free_port, reachable, redis_binary, reserve

MASTER_NAME = "mymaster"


def _wait(what: str, check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (redis.RedisError, OSError):
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{what}: not within {timeout_s} s")


class _Procs:
    """Redis processes started by one deployment; all of them die with it."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir.resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, port: int, *args: str, sentinel: bool = False) -> subprocess.Popen[bytes]:
        node_dir = self.workdir / str(port)
        node_dir.mkdir(exist_ok=True)
        if sentinel:
            conf = node_dir / "sentinel.conf"
            conf.write_text("\n".join(args) + "\n")
            argv = [redis_binary(), str(conf), "--sentinel"]
        else:
            argv = [redis_binary(), "--save", "", "--appendonly", "no", *args]
        argv += ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(node_dir)]
        argv += ["--logfile", str(node_dir / "redis.log")]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs[port] = proc
        _wait(f"redis on {port}", lambda: reachable(f"redis://127.0.0.1:{port}", 0.2), 10)
        return proc

    def kill(self, port: int) -> float:
        """SIGKILL one process; returns the monotonic time it died."""
        proc = self.procs[port]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        return time.monotonic()

    def masters(self, ports: list[int]) -> frozenset[int]:
        """Those of `ports` still alive that say they are masters (two at once: a split
        brain, a spurious failover under way)."""
        found = set()
        for port in ports:
            if self.procs[port].poll() is not None:
                continue
            with contextlib.suppress(redis.RedisError, OSError):
                if _client(port).info("replication")["role"] == "master":
                    found.add(port)
        return frozenset(found)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


def cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too."""
    for _ in range(200):
        port = free_port()
        if reserve(port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


def _client(port: int) -> redis.Redis:
    return redis.Redis(port=port, socket_timeout=2, socket_connect_timeout=2)


class SentinelSet:
    """A master, two replicas and three sentinels (quorum 2), failing over in ~2 s."""

    def __init__(self, workdir: Path, down_after_ms: int = 1000) -> None:
        self.procs = _Procs(workdir)
        self.down_after_ms = down_after_ms
        self.data_ports = [free_port() for _ in range(3)]
        self.sentinel_ports: list[int] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{MASTER_NAME}/0"

    def __enter__(self) -> SentinelSet:
        try:
            master = self.data_ports[0]
            self.procs.start(master)
            for port in self.data_ports[1:]:
                self.procs.start(port, "--replicaof", "127.0.0.1", str(master))
            _wait("replicas in sync", lambda: self._replicas_online(master) == 2)
            for _ in range(3):
                port = free_port()
                self.sentinel_ports.append(port)
                self.procs.start(
                    port,
                    f"port {port}",
                    f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master} 2",
                    f"sentinel down-after-milliseconds {MASTER_NAME} {self.down_after_ms}",
                    f"sentinel failover-timeout {MASTER_NAME} 10000",
                    f"sentinel parallel-syncs {MASTER_NAME} 2",
                    sentinel=True,
                )
            _wait("sentinels know each other and the replicas", self._sentinels_ready)
        except BaseException:
            self.procs.stop_all()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.procs.stop_all()

    def _replicas_online(self, port: int) -> int:
        info: Any = _client(port).info("replication")
        return sum(
            1
            for key, value in info.items()
            if key.startswith("slave") and isinstance(value, dict) and value["state"] == "online"
        )

    def _sentinels_ready(self) -> bool:
        for port in self.sentinel_ports:
            state: Any = _client(port).sentinel_master(MASTER_NAME)
            if state["num-other-sentinels"] < 2 or state["num-slaves"] < 2:
                return False
        return True

    def master_port(self) -> int:
        """The master's port, as the first sentinel that answers sees it."""
        for port in self.sentinel_ports:
            try:
                _, master = _client(port).sentinel_get_master_addr_by_name(MASTER_NAME)
                return int(master)
            except (redis.RedisError, OSError, TypeError):
                continue
        raise RuntimeError("no sentinel answers")

    def masters(self) -> frozenset[int]:
        """The data nodes that say they are masters now."""
        return self.procs.masters(self.data_ports)

    def kill_master(self) -> tuple[int, float]:
        """SIGKILL the master; returns its port and when it died."""
        port = self.master_port()
        return port, self.procs.kill(port)

    def wait_promotion(self, old: int, timeout_s: float = 60.0) -> float:
        """Wait until a sentinel names a new master that says it is one; returns when."""

        def promoted() -> bool:
            port = self.master_port()
            return port != old and _client(port).info("replication")["role"] == "master"

        _wait("a replica promoted", promoted, timeout_s)
        return time.monotonic()


class ClusterSet:
    """Three masters and three replicas (`redis-cli --cluster create --cluster-replicas 1`)."""

    def __init__(self, workdir: Path, node_timeout_ms: int = 1000) -> None:
        self.procs = _Procs(workdir)
        self.node_timeout_ms = node_timeout_ms
        self.ports: list[int] = []
        for _ in range(6):
            self.ports.append(cluster_port())

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports[:3]) + "/"

    def __enter__(self) -> ClusterSet:
        cli = shutil.which("redis-cli")
        if cli is None:
            raise FileNotFoundError("redis-cli is needed to create a cluster")
        try:
            for port in self.ports:
                self.procs.start(
                    port,
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    f"nodes-{port}.conf",
                    "--cluster-node-timeout",
                    str(self.node_timeout_ms),
                )
            subprocess.run(
                [
                    cli,
                    "--cluster",
                    "create",
                    *(f"127.0.0.1:{p}" for p in self.ports),
                    "--cluster-replicas",
                    "1",
                    "--cluster-yes",
                ],
                check=True,
                capture_output=True,
                timeout=60,
            )
            _wait("cluster ok on every node", self._healthy, 60)
        except BaseException:
            self.procs.stop_all()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.procs.stop_all()

    def alive(self) -> list[int]:
        return [p for p, proc in self.procs.procs.items() if proc.poll() is None]

    def _healthy(self) -> bool:
        for port in self.alive():
            info: Any = _client(port).cluster("info")
            if info["cluster_state"] != "ok":
                return False
        infos: list[Any] = [_client(p).info("replication") for p in self.alive()]
        masters = [i for i in infos if i["role"] == "master"]
        in_sync = all(
            any(isinstance(v, dict) and v.get("state") == "online" for v in i.values())
            for i in masters
        )
        return len(masters) == 3 and in_sync

    def masters(self) -> frozenset[int]:
        """The nodes that say they are masters now."""
        return self.procs.masters(self.ports)

    def master_of_slot(self, slot: int) -> int:
        """The port of the master serving `slot` now."""
        for port in self.alive():
            try:
                slots: Any = _client(port).execute_command("CLUSTER SLOTS")
            except (redis.RedisError, OSError):
                continue
            for start, end, master, *_ in slots:
                if start <= slot <= end:
                    return int(master[1])
        raise RuntimeError(f"no node serves slot {slot}")

    def kill_master_of(self, slot: int) -> tuple[int, float]:
        port = self.master_of_slot(slot)
        return port, self.procs.kill(port)

    def wait_promotion(self, old: int, slot: int, timeout_s: float = 60.0) -> float:
        """Wait until another node serves `slot` as master and the cluster is ok again."""

        def promoted() -> bool:
            port = self.master_of_slot(slot)
            if port == old:
                return False
            info: Any = _client(port).cluster("info")
            return bool(info["cluster_state"] == "ok")

        _wait("a replica promoted", promoted, timeout_s)
        return time.monotonic()
