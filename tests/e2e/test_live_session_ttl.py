"""A session open on a gateway keeps its record in Redis however quiet it is: its gateway
pushes the expiry back (services/gateway/store.py `keep_alive`), so a gateway killed after
a quiet spell longer than the resume window still leaves a record to resume. The quiet
spell is simulated by cutting the record's TTL (EXPIRE), not waited out."""

from __future__ import annotations

import asyncio
import json

import websockets
from redis.asyncio import Redis

from services.common.bus.keys import Keys
from services.gateway.admission import AdmissionSettings
from services.gateway.app import create_app
from services.gateway.settings import GatewaySection, GatewaySettings
from services.tts.app import create_app as tts_app
from services.tts.settings import TtsSettings
from tests.conftest import RedisProc
from tests.servers import ServerThread

WINDOW_S = 15
"""The resume window: the gateway refreshes its sessions' records every third of it."""
LEFT_S = 10
"""What is left of the window after the quiet spell: more than a refresh period."""


async def test_a_quiet_open_session_s_record_is_kept_alive(redis_server: RedisProc) -> None:
    section = GatewaySection(resume_window_s=WINDOW_S, admission=AdmissionSettings(enabled=False))
    settings = GatewaySettings(profile="fake", redis=redis_server.settings(), gateway=section)
    redis = Redis.from_url(settings.redis.url)
    try:
        with (
            ServerThread(tts_app(TtsSettings(profile="fake", redis=settings.redis))),
            ServerThread(create_app(settings)) as gw,
        ):
            async with websockets.connect(f"{gw.ws}/v1/stream") as ws:
                created = json.loads(await ws.recv())
                key = Keys(settings.redis.prefix).session(created["session"]["id"])
                await ws.send(json.dumps({"type": "conversation.text", "text": "hello"}))
                async with asyncio.timeout(30):  # the turn's saves are done with its reply
                    while not _is_done(await ws.recv()):
                        pass
                assert await redis.exists(key)
                await redis.expire(key, LEFT_S)  # quiet for most of the window
                async with asyncio.timeout(60):
                    while (ttl := await redis.ttl(key)) <= LEFT_S:  # until it is refreshed
                        assert ttl > 0, "the open session's record expired"
                        await asyncio.sleep(0.05)
                assert await redis.ttl(key) <= WINDOW_S
    finally:
        await redis.aclose()


def _is_done(message: str | bytes) -> bool:
    return isinstance(message, str) and json.loads(message)["type"] == "response.done"
