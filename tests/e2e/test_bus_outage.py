"""A session outlives its Redis: with the bus out of reach, its jobs are dropped and the
client is told (`tts_unavailable`, the response `failed`), the connection stays open.
The fault drill found sessions closed with 1011 instead when Redis restarted."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import websockets

from services.common.bus.settings import RedisSettings
from services.gateway.admission import AdmissionSettings
from services.gateway.app import create_app
from services.gateway.settings import GatewaySection, GatewaySettings
from services.ops.redis_server import free_port, start_redis
from services.tts.app import create_app as tts_app
from services.tts.settings import TtsSettings
from tests.servers import ServerThread


async def _until(ws: websockets.ClientConnection, kind: str) -> list[dict[str, object]]:
    events = []
    while not events or events[-1]["type"] != kind:
        message = await asyncio.wait_for(ws.recv(), 20)
        if isinstance(message, str):
            events.append(json.loads(message))
    return events


async def test_a_session_outlives_its_redis(tmp_path: Path) -> None:
    port = free_port()
    redis = start_redis(port, tmp_path)
    bus = RedisSettings(url=f"redis://127.0.0.1:{port}/0")
    # a timeout the healthy first turn cannot meet on a loaded machine, short enough for
    # the second to fail by it if the bus says nothing
    section = GatewaySection(tts_timeout_s=5.0, admission=AdmissionSettings(enabled=False))
    settings = GatewaySettings(profile="fake", redis=bus, gateway=section)
    try:
        with (
            ServerThread(tts_app(TtsSettings(profile="fake", redis=settings.redis))),
            ServerThread(create_app(settings)) as gateway,
        ):
            async with websockets.connect(f"{gateway.ws}/v1/stream") as ws:
                await ws.recv()  # session.created
                await ws.send(json.dumps({"type": "response.create", "text": "one two"}))
                assert (await _until(ws, "response.done"))[-1]["status"] == "completed"
                redis.kill()
                redis.wait(10)
                await ws.send(json.dumps({"type": "response.create", "text": "three four"}))
                events = await _until(ws, "response.done")
                assert events[-1]["status"] == "failed"
                assert "tts_unavailable" in [e.get("code") for e in events]
                await ws.send(json.dumps({"type": "session.close"}))
                await ws.wait_closed()
                assert ws.close_code == 1000  # never 1011
    finally:
        if redis.poll() is None:
            redis.kill()
