"""What the gateway adds in front of the duplex service, per 80 ms frame and per session.

    python -m benchmarks.duplex_gateway --sessions 1,5,10,20 --seconds 15 \\
        --out benchmarks/results/duplex_gateway_fake.json

Redis, the duplex service (its `fake` engine: an echo, no model, so what is measured is
transport, not inference; `gather_ms` 0, so a step never waits for other sessions) and a
gateway with `backend: duplex` run as processes (`voice-agent up`'s layout). N clients
each stream 20 ms frames (as the browser page and most clients do) at real-time pace, with
staggered starts, over three paths:
- `direct`: the duplex service's own `/v1/stream/duplex` at 24 kHz both ways;
- `gateway`: the gateway's `/v1/stream` at 24 kHz both ways (no resampling anywhere);
- `gateway_16k_in`: `/v1/stream` at its default 16 kHz input (the gateway resamples each
  frame to 24 kHz) and 24 kHz output.
Per model frame (80 ms): the time from sending the client frame that completes model frame
k to receiving the agent's frame k (the step frame k made; the fake engine's audio in it is
frame k-1's echo). On the 16 kHz path the gateway resamples each frame (its filter
delays the sound by 2 ms; every model frame is still complete with its last client frame).
The gateway's added latency per frame is a path's p50 minus `direct`'s at the same N.
Per session: the gateway's CPU seconds (its /health `process.cpu_seconds`) over the run,
divided by sessions × seconds: the share of one core a duplex session costs the gateway
(VAD included). Every path runs once at the largest N before anything is measured (the
first sessions of a fresh process are slower), and the first second of every session is
left out (connection, warm-up).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from websockets.asyncio.client import ClientConnection, connect

from services.common.stats import percentile
from services.loadtest.report import write
from services.ops.cli import wait_ready
from services.ops.redis_server import free_port, start_redis

FRAME_S = 0.08
CLIENT_FRAMES = 4  # 20 ms client frames per 80 ms model frame
OUT_FRAME_BYTES = 2 * 1920  # the agent's 80 ms at 24 kHz
WARM_UP_FRAMES = 13  # about one second


@contextmanager
def duplex_stack(
    max_sessions: int, engine: str = "fake", duplex_python: str = sys.executable
) -> Iterator[dict[str, str]]:
    """Redis, the duplex service (`engine`, run by `duplex_python`) and a duplex-backed
    gateway; their URLs."""
    workdir = Path(tempfile.mkdtemp(prefix="va-duplex-bench-"))
    redis_port, duplex_port, gateway_port = free_port(), free_port(), free_port()
    redis = start_redis(redis_port, workdir)
    env = {
        **os.environ,
        "VA_REDIS__URL": f"redis://127.0.0.1:{redis_port}/0",
        "VA_AUTH__REQUIRED": "false",  # loopback only, as `voice-agent up` runs it
        "VA_LOG_LEVEL": "warning",
        "VA_DUPLEX__ENGINE": engine,
        "VA_DUPLEX__MOSHI__DEVICE": "cpu",
        "VA_DUPLEX__MAX_SESSIONS": str(max_sessions),
        "VA_DUPLEX__GATHER_MS": "0",
        "VA_GATEWAY__BACKEND": "duplex",
        "VA_GATEWAY__DUPLEX_URL": f"ws://127.0.0.1:{duplex_port}",
        "VA_GATEWAY__END_OF_TURN": "silence",
    }
    ports = {"duplex": duplex_port, "gateway": gateway_port}
    python = {"duplex": duplex_python, "gateway": sys.executable}
    procs = [
        subprocess.Popen(
            [python[name], "-m", f"services.{name}.server", "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(workdir / f"{name}.log", "wb"),  # noqa: SIM115
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
            proc.wait(30)


def _url(urls: dict[str, str], path: str) -> str:
    if path == "direct":
        base = urls["duplex"].replace("http://", "ws://")
        return f"{base}/v1/stream/duplex?input_sample_rate=24000&output_sample_rate=24000"
    return urls["gateway"].replace("http://", "ws://") + "/v1/stream"


async def _open(urls: dict[str, str], path: str) -> tuple[ClientConnection, int]:
    """A connection ready for audio, and its input rate."""
    ws = await connect(_url(urls, path), compression=None)
    if path == "direct":
        assert json.loads(await ws.recv())["type"] == "ready"
        return ws, 24000
    assert json.loads(await ws.recv())["type"] == "session.created"
    if path == "gateway_16k_in":
        return ws, 16000
    update = {"input_sample_rate": 24000, "output_sample_rate": 24000}
    await ws.send(json.dumps({"type": "session.update", "session": update}))
    return ws, 24000


async def _session(
    urls: dict[str, str], path: str, frames: int, offset_s: float, rng: np.random.Generator
) -> list[float]:
    """One client: `frames` paced frames; each frame's round trip in ms (after warm-up)."""
    ws, rate = await _open(urls, path)
    samples = int(rate * FRAME_S) // CLIENT_FRAMES  # per client frame
    total = samples * CLIENT_FRAMES * frames
    audio = 0.1 * np.sin(np.arange(total) * 2 * np.pi * 220 / rate) + rng.normal(0, 0.01, total)
    pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
    sent: list[float] = []  # when each model frame's last client frame was sent
    arrived: list[float] = []

    async def read() -> None:
        received = 0
        async for message in ws:
            if isinstance(message, bytes):
                received += len(message)
                while len(arrived) < received // OUT_FRAME_BYTES:
                    arrived.append(time.perf_counter())
                if len(arrived) >= frames - 1:
                    return

    reader = asyncio.create_task(read())
    await asyncio.sleep(offset_s)
    start = time.perf_counter()
    step = FRAME_S / CLIENT_FRAMES
    for i in range(frames * CLIENT_FRAMES):
        await asyncio.sleep(max(0.0, start + (i + 1) * step - time.perf_counter()))
        if i % CLIENT_FRAMES == CLIENT_FRAMES - 1:
            sent.append(time.perf_counter())
        await ws.send(pcm[i * 2 * samples : (i + 1) * 2 * samples])
    try:
        await asyncio.wait_for(reader, 10)
    finally:
        await ws.close()
    return [
        1000 * (a - s)
        for s, a in zip(sent[WARM_UP_FRAMES:], arrived[WARM_UP_FRAMES:], strict=False)
    ]


def _cpu(url: str) -> float:
    return float(httpx.get(f"{url}/health", timeout=10).json()["process"]["cpu_seconds"])


async def _level(urls: dict[str, str], path: str, sessions: int, seconds: float) -> dict[str, Any]:
    frames = int(seconds / FRAME_S)
    rng = np.random.default_rng(sessions)
    cpu = {name: _cpu(url) for name, url in urls.items()}
    began = time.perf_counter()
    runs = [_session(urls, path, frames, FRAME_S * i / sessions, rng) for i in range(sessions)]
    results = await asyncio.gather(*runs)
    elapsed = time.perf_counter() - began
    used = {name: _cpu(url) - cpu[name] for name, url in urls.items()}
    times = [t for run in results for t in run]
    return {
        "path": path,
        "sessions": sessions,
        "frames_measured": len(times),
        "round_trip_ms": {
            "p50": round(percentile(times, 50), 2),
            "p95": round(percentile(times, 95), 2),
            "p99": round(percentile(times, 99), 2),
            "max": round(max(times), 2),
        },
        "cpu_core_share_per_session": {
            name: round(used[name] / (sessions * elapsed), 4) for name in used
        },
        "load_average": round(os.getloadavg()[0], 2),
    }


async def _run(
    sessions: list[int], seconds: float, engine: str, duplex_python: str
) -> list[dict[str, Any]]:
    levels = []
    with duplex_stack(max(sessions), engine, duplex_python) as urls:
        for path in ("direct", "gateway", "gateway_16k_in"):  # warm-up, not reported
            await _level(urls, path, max(sessions), 3.0)
        for n in sessions:
            for path in ("direct", "gateway", "gateway_16k_in"):
                level = await _level(urls, path, n, seconds)
                print(json.dumps(level), flush=True)
                levels.append(level)
    return levels


def _overhead(levels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each gateway path's p50/p99 minus `direct`'s at the same number of sessions."""
    direct = {lv["sessions"]: lv["round_trip_ms"] for lv in levels if lv["path"] == "direct"}
    rows = []
    for lv in levels:
        base = direct.get(lv["sessions"])
        if lv["path"] == "direct" or base is None:
            continue
        rows.append(
            {
                "path": lv["path"],
                "sessions": lv["sessions"],
                "added_p50_ms": round(lv["round_trip_ms"]["p50"] - base["p50"], 2),
                "added_p99_ms": round(lv["round_trip_ms"]["p99"] - base["p99"], 2),
                "gateway_core_share_per_session": lv["cpu_core_share_per_session"]["gateway"],
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", default="1,5,10,20", help="concurrent sessions per level")
    parser.add_argument("--seconds", type=float, default=15.0, help="audio per session")
    parser.add_argument("--engine", default="fake", help="the duplex engine (fake: transport)")
    parser.add_argument(
        "--duplex-python",
        default=sys.executable,
        help="the duplex service's interpreter (.venv-duplex/bin/python for moshi-random)",
    )
    parser.add_argument("--out", default="benchmarks/results/duplex_gateway_fake.json")
    parser.add_argument("--note", default="", help="what to know about the machine and run")
    args = parser.parse_args()
    sessions = [int(n) for n in args.sessions.split(",")]
    levels = asyncio.run(_run(sessions, args.seconds, args.engine, args.duplex_python))
    body = {
        "benchmark": "duplex_gateway",
        "engine": args.engine,
        "seconds_per_session": args.seconds,
        "note": args.note,
        "levels": levels,
        "gateway_overhead": _overhead(levels),
    }
    write(Path(args.out), body)


if __name__ == "__main__":
    main()
