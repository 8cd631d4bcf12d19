"""The gateway in front of the duplex service answers a client's close at once, whatever its
session is doing (here: a save waiting on a stopped Redis), and ends a session whose duplex
service stops answering with a typed error instead of dead air (docs/duplex.md)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import websockets
from websockets.asyncio.server import ServerConnection, serve

from services.common.audio.pcm import float_to_pcm16
from services.common.bus.settings import RedisSettings
from services.common.protocol.duplex import DuplexReady
from services.gateway.app import create_app as gateway_app
from services.gateway.settings import GatewaySection, GatewaySettings
from services.ops.redis_server import free_port, start_redis
from tests.conftest import RedisProc
from tests.duplex_gateway import duplex_stack, session, stream
from tests.servers import ServerThread

CLOSE_BOUND_S = 3.0
"""Redis stopped, the defect answered only when the save gave up: its socket timeout is 6 s
(then retried), so this bound is loose enough for a loaded machine and still tells."""
FRAME_24K = 1920


async def test_a_close_is_answered_while_a_save_waits_on_redis(tmp_path: Path) -> None:
    """A `session.update` whose save waits on a stopped Redis, one audio frame behind it: the
    close is read (the session reads its socket ahead of the handling) and answered while
    Redis is still stopped; the session ends once Redis is back."""
    port = free_port()
    redis = start_redis(port, tmp_path)
    bus = RedisSettings(url=f"redis://127.0.0.1:{port}/0")
    try:
        with duplex_stack(bus) as stack:
            ws = await websockets.connect(stack.stream_url, close_timeout=60, max_queue=None)
            events = asyncio.create_task(_read_all(ws))
            os.kill(redis.pid, signal.SIGSTOP)
            try:
                update = {"type": "session.update", "session": {"voice": "x"}}
                await ws.send(json.dumps(update))
                await ws.send(bytes(640))  # a live client's next 20 ms of audio
                # no wait here: the frames are read in order, so the update's save (waiting
                # on the stopped Redis) comes before the close whenever it is sent
                async with asyncio.timeout(CLOSE_BOUND_S):
                    await ws.close()
            finally:
                os.kill(redis.pid, signal.SIGCONT)
            assert ws.close_code == 1000
            await events
            async with asyncio.timeout(60):  # the session ends, its duplex slot freed
                while stack.app.state.sessions:
                    await asyncio.sleep(0.05)
    finally:
        redis.kill()
        redis.wait(10)


async def _read_all(ws: websockets.ClientConnection) -> None:
    with contextlib.suppress(websockets.ConnectionClosed):
        async for _ in ws:
            pass


@contextlib.asynccontextmanager
async def frozen_service(answered: int) -> AsyncIterator[str]:
    """A duplex service that admits a session, echoes its first `answered` frames, then
    answers nothing more (a wedged GPU, a stuck step), its socket open and its pings
    answered: the base URL."""

    async def handler(ws: ServerConnection) -> None:
        ready = DuplexReady(
            session_id="dup_frozen",
            input_sample_rate=24000,
            output_sample_rate=24000,
            engine="fake",
            model="frozen",
        )
        await ws.send(ready.dump())
        seen = 0
        with contextlib.suppress(websockets.ConnectionClosed):  # the gateway drops it
            async for message in ws:
                seen += 1
                if seen <= answered and isinstance(message, bytes):
                    await ws.send(message)

    async with serve(handler, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"ws://127.0.0.1:{port}"


async def test_a_duplex_service_that_stops_answering_ends_the_session(
    redis_server: RedisProc,
) -> None:
    """Audio goes to the service and nothing comes back for `duplex_stall_timeout_s`: the
    session ends with `duplex_unavailable` and close 1011 (it waited for the link's
    keepalive, ~40 s, or forever while the frozen service's socket still answered pings)."""
    async with frozen_service(answered=2) as url:
        section = GatewaySection(
            backend="duplex", duplex_url=url, end_of_turn="silence", duplex_stall_timeout_s=0.5
        )
        app = gateway_app(GatewaySettings(redis=redis_server.settings(), gateway=section))
        with ServerThread(app) as gateway:
            async with session(f"{gateway.ws}/v1/stream") as client:
                await client.event("response.created")
                frame = float_to_pcm16(np.full(FRAME_24K, 0.1, np.float32))
                await stream(client.ws, frame * 2, 24000)
                await client.until(lambda: client.samples().size > 0)  # it answered, at first
                sender = asyncio.create_task(_keep_talking(client.ws, frame))
                try:
                    await client.closed(timeout_s=30)
                finally:
                    sender.cancel()
    assert client.ws.close_code == 1011
    error, done = client.of("error")[0], client.of("response.done")[0]
    assert (error["code"], error["fatal"]) == ("duplex_unavailable", True)
    assert "answered nothing" in error["message"]
    assert done["status"] == "failed"


async def _keep_talking(ws: websockets.ClientConnection, frame: bytes) -> None:
    """The user's audio, one model frame after another, until the connection ends."""
    with contextlib.suppress(websockets.ConnectionClosed):
        while True:
            await stream(ws, frame, 24000)
            await asyncio.sleep(0.08)
