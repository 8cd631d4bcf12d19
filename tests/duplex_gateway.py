"""Helpers for the tests of the gateway in front of the duplex service: both as real servers
on free ports (the duplex service with its `fake` echo engine, no torch), and a client that
keeps everything a session sends."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from websockets.asyncio.client import ClientConnection, connect

from services.common.auth.settings import AuthSettings
from services.common.bus.settings import RedisSettings
from services.gateway.app import create_app as gateway_app
from services.gateway.settings import GatewaySection, GatewaySettings
from tests.duplex_client import duplex_server
from tests.servers import ServerThread

Json = dict[str, Any]


@dataclass
class DuplexStack:
    """The duplex service and a gateway whose backend it is."""

    duplex: ServerThread
    gateway: ServerThread
    redis: RedisSettings
    app: Any
    """The gateway's app (its `state.sessions`)."""

    @property
    def stream_url(self) -> str:
        return f"{self.gateway.ws}/v1/stream"


@contextmanager
def duplex_stack(
    redis: RedisSettings,
    auth: AuthSettings | None = None,
    gateway: dict[str, Any] | None = None,
    **duplex: Any,
) -> Iterator[DuplexStack]:
    """The duplex service (`fake` engine; `duplex` are its DuplexSection fields) and a gateway
    with `backend: duplex` in front of it (`gateway`: its GatewaySection fields)."""
    auth = auth or AuthSettings(required=False)
    with duplex_server(redis, auth=auth, engine="fake", **duplex) as service:
        section = GatewaySection(
            backend="duplex",
            duplex_url=service.ws,
            end_of_turn="silence",
            **(gateway or {}),
        )
        app = gateway_app(GatewaySettings(redis=redis, auth=auth, gateway=section))
        with ServerThread(app) as front:
            yield DuplexStack(service, front, redis, app)


@dataclass
class Session:
    """A client connection: every event and all the audio it received, in order."""

    ws: ClientConnection
    events: list[Json] = field(default_factory=list)
    audio: bytearray = field(default_factory=bytearray)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    ended: bool = False
    """The connection is closed and every message before its close has been read."""

    def of(self, kind: str) -> list[Json]:
        return [e for e in self.events if e["type"] == kind]

    def samples(self) -> npt.NDArray[np.int16]:
        return np.frombuffer(bytes(self.audio), "<i2")

    async def until(self, check: Callable[[], bool], timeout_s: float = 30.0) -> None:
        """Wait for received messages to make `check` true."""
        async with asyncio.timeout(timeout_s):
            while not check():
                self.changed.clear()
                await self.changed.wait()

    async def closed(self, timeout_s: float = 30.0) -> None:
        """Wait for the close, and for every message sent before it. `ws.close_code` is set
        as the close frame arrives, which can be before the reader has taken the messages
        queued ahead of it (an error event, say)."""
        await self.until(lambda: self.ended, timeout_s)

    async def event(self, kind: str, timeout_s: float = 30.0) -> Json:
        """The first event of `kind` (waits for it)."""
        await self.until(lambda: bool(self.of(kind)), timeout_s)
        return self.of(kind)[0]

    async def send(self, message: Json) -> None:
        await self.ws.send(json.dumps(message))

    async def _read(self) -> None:
        with contextlib.suppress(Exception):
            async for message in self.ws:
                if isinstance(message, bytes):
                    self.audio.extend(message)
                else:
                    self.events.append(json.loads(message))
                self.changed.set()
        self.ended = True
        self.changed.set()


@asynccontextmanager
async def session(url: str, **kwargs: Any) -> AsyncIterator[Session]:
    """A connection whose messages are read all along (the client never holds anything up)."""
    async with connect(url, **kwargs) as ws:
        client = Session(ws)
        reader = asyncio.create_task(client._read())
        try:
            yield client
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader


async def stream(ws: ClientConnection, pcm: bytes, rate: int, frame_ms: int = 20) -> None:
    """PCM16 in frames of `frame_ms`, as fast as the gateway takes them."""
    step = 2 * rate * frame_ms // 1000
    for start in range(0, len(pcm), step):
        await ws.send(pcm[start : start + step])


def lag_and_gain(
    sent: npt.NDArray[np.float32], heard: npt.NDArray[np.float32], max_lag: int
) -> tuple[int, float, float]:
    """(lag in samples, gain, correlation) of the copy of `sent` in `heard`: the lag that
    correlates best, the least-squares gain there, and the normalised correlation."""
    best = (0, -1.0)
    for lag in range(max_lag):
        n = min(sent.size, heard.size - lag)
        a, b = sent[:n], heard[lag : lag + n]
        score = float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-12))
        if score > best[1]:
            best = (lag, score)
    lag = best[0]
    n = min(sent.size, heard.size - lag)
    a, b = sent[:n], heard[lag : lag + n]
    return lag, float(np.dot(a, b) / np.dot(a, a)), best[1]
