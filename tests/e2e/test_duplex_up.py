"""`VA_PROFILE=duplex voice-agent up`: Redis (here: the tests' own), the duplex service and a
gateway in front of it, as processes; no ASR or TTS. The duplex service runs its `fake`
engine from this environment (there is no .venv-duplex here)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
from websockets.asyncio.client import connect

from services.common.audio.pcm import float_to_pcm16
from services.ops.redis_server import free_port
from tests.conftest import RedisProc


async def test_up_starts_the_duplex_service_behind_the_gateway(
    redis_server: RedisProc, tmp_path: Path
) -> None:
    gateway, duplex = free_port(), free_port()
    env = {
        **os.environ,
        "VA_PROFILE": "duplex",
        "VA_DUPLEX__ENGINE": "fake",
        "VA_GATEWAY__SERVER__PORT": str(gateway),
        "VA_DUPLEX__SERVER__PORT": str(duplex),
        "VA_GATEWAY__END_OF_TURN": "silence",
        "VA_REDIS__URL": redis_server.url,
        "VA_REDIS__PREFIX": f"up{gateway}",
        "VENV_DUPLEX": str(tmp_path / "no-duplex-venv"),
    }
    command = [sys.executable, "-m", "services.ops.cli", "up", "--state-dir", str(tmp_path)]
    up = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    try:
        urls = {"gateway": f"http://127.0.0.1:{gateway}", "duplex": f"http://127.0.0.1:{duplex}"}
        # `up` prints where to connect once it has seen every service ready itself; a test
        # that goes on when the services answer can stop it before that line (it did, in CI)
        printed = await asyncio.wait_for(asyncio.to_thread(_until_up, up), 180)
        assert "duplex     http://127.0.0.1:" in printed and "ASR" not in printed
        assert httpx.get(f"{urls['gateway']}/health", timeout=10).json()["backend"] == "duplex"
        async with connect(f"ws://127.0.0.1:{gateway}/v1/stream") as ws:
            created = json.loads(await ws.recv())
            assert created["type"] == "session.created"
            await ws.send(float_to_pcm16(np.full(16000 // 2, 0.1, np.float32)))  # 500 ms
            while not isinstance(await ws.recv(), bytes):  # the echo comes back
                pass
    finally:
        up.send_signal(signal.SIGINT)
        up.communicate(timeout=60)
    assert up.returncode == 0


def _until_up(up: subprocess.Popen[str]) -> str:
    """What `up` printed, up to and including the lines saying where to connect."""
    assert up.stdout is not None
    lines: list[str] = []
    for line in up.stdout:
        lines.append(line)
        if "Ctrl-C stops everything" in line:  # the last of them
            break
    return "".join(lines)
