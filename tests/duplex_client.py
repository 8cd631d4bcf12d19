"""Helpers for the duplex service's tests: a server on a free port, a PCM client, metrics."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
from websockets.asyncio.client import ClientConnection

from services.common.auth.settings import AuthSettings
from services.common.bus.settings import RedisSettings
from services.duplex.app import create_app
from services.duplex.engines.base import DuplexEngine
from services.duplex.settings import DuplexSection, DuplexSettings
from tests.servers import ServerThread

RATE = 24000
FRAME = 1920


@contextmanager
def duplex_server(
    redis: RedisSettings,
    instance: DuplexEngine | None = None,
    auth: AuthSettings | None = None,
    **section: Any,
) -> Iterator[ServerThread]:
    """The duplex service on a free port (authentication off unless `auth` says); `section`
    are DuplexSection fields, `instance` an engine built already."""
    settings = DuplexSettings(
        redis=redis,
        auth=auth or AuthSettings(required=False),
        duplex=DuplexSection(**section),
    )
    with ServerThread(create_app(settings, instance)) as server:
        yield server


@dataclass
class Heard:
    """What a PCM session received: the agent's audio and its text events, in order."""

    audio: list[bytes] = field(default_factory=list)
    text: list[dict[str, Any]] = field(default_factory=list)

    def samples(self) -> npt.NDArray[np.int16]:
        return np.frombuffer(b"".join(self.audio), "<i2")


def tone(frames: int, freq: float = 220.0, rate: int = RATE, level: float = 0.3) -> bytes:
    """`frames` frames (80 ms) of a sine as PCM16 bytes."""
    t = np.arange(frames * rate * 80 // 1000) / rate
    return (level * np.sin(2 * np.pi * freq * t) * 32767).astype("<i2").tobytes()


async def receive(ws: ClientConnection, frames: int, timeout_s: float = 60.0) -> Heard:
    """Read until `frames` audio frames came (text events kept on the way)."""
    heard = Heard()
    async with asyncio.timeout(timeout_s):
        while len(heard.audio) < frames:
            message = await ws.recv()
            if isinstance(message, bytes):
                heard.audio.append(message)
            else:
                heard.text.append(json.loads(message))
    return heard


def metric(base_url: str, name: str) -> float:
    """The sum of every sample of `name` on the service's /metrics."""
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if re.match(rf"{re.escape(name)}(\{{| )", line):
            total += float(line.rsplit(" ", 1)[1])
    return total


def histogram_count_above(base_url: str, name: str, bound: float) -> float:
    """Observations of histogram `name` above `bound` (count minus the `le=bound` bucket)."""
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    count = le = 0.0
    for line in text.splitlines():
        if line.startswith(f"{name}_count"):
            count = float(line.rsplit(" ", 1)[1])
        elif line.startswith(f'{name}_bucket{{le="{float(bound)}"}}'):
            le = float(line.rsplit(" ", 1)[1])
    return count - le


async def refused_chat_audio(url: str, payload: bytes) -> tuple[bytes | str, int | None]:
    """One `/api/chat` audio message (0x01) the service must refuse: what it answered (the
    0x05 error), and the close code that followed."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    async with connect(url) as ws:
        assert await ws.recv() == b"\x00"  # the handshake
        await ws.send(b"\x01" + payload)
        answer = await ws.recv()
        try:
            await ws.recv()
        except ConnectionClosed:
            pass
        else:
            raise AssertionError("the socket stayed open after the refusal")
    return answer, ws.close_code
