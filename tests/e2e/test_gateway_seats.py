"""A gateway's places and the sessions it takes back: `max_sessions` counts a phone call that
has not started its stream yet, and a session saved with an agent this gateway lacks resumes
with its own agent instead of failing its first turn."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest
import websockets
from pydantic import SecretStr

from services.common.auth.settings import AuthSettings
from services.common.bus.settings import RedisSettings
from services.gateway.admission import AdmissionSettings
from services.gateway.agent import AGENTS, EchoAgent
from services.gateway.app import create_app
from services.gateway.settings import GatewaySection, GatewaySettings, TwilioSettings
from services.tts.app import create_app as tts_app
from services.tts.settings import TtsSettings
from tests.conftest import RedisProc
from tests.e2e.test_auth import SECRET, new_key
from tests.servers import ServerThread


def _settings(bus: RedisSettings, max_sessions: int = 100) -> GatewaySettings:
    section = GatewaySection(max_sessions=max_sessions, admission=AdmissionSettings(enabled=False))
    return GatewaySettings(profile="fake", redis=bus, gateway=section)


@pytest.fixture(scope="module")
def bus(redis_server: RedisProc) -> Iterator[RedisSettings]:
    """One prefix for the fake TTS and every gateway of a test."""
    settings = redis_server.settings()
    with ServerThread(tts_app(TtsSettings(profile="fake", redis=settings))):
        yield settings


START = {
    "event": "start",
    "streamSid": "MZ1",
    "start": {
        "streamSid": "MZ1",
        "callSid": "CA1",
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
    },
}


async def _admitted(http: str, headers: dict[str, str] | None = None) -> int:
    async with httpx.AsyncClient() as client:
        health = (await client.get(f"{http}/health", headers=headers)).json()
    return int(health["admitted"])


async def _first(ws: websockets.ClientConnection) -> dict[str, object]:
    event: dict[str, object] = json.loads(await asyncio.wait_for(ws.recv(), 10))
    return event


async def test_a_call_waiting_for_its_start_holds_its_place(bus: RedisSettings) -> None:
    with ServerThread(create_app(_settings(bus, max_sessions=1))) as gateway:
        call = await websockets.connect(f"{gateway.ws}/v1/twilio")
        async with asyncio.timeout(10):  # admitted at the accept; no session before its start
            while await _admitted(gateway.http) < 1:
                await asyncio.sleep(0.02)
        async with websockets.connect(f"{gateway.ws}/v1/stream") as refused:
            error = await _first(refused)
            assert (error["type"], error["code"]) == ("error", "capacity"), error
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(refused.recv(), 10)
            assert refused.close_code == 1013
        await call.send(json.dumps(START))  # the call starts: it is the one session
        await call.close()
        async with asyncio.timeout(10):  # its place is free once its handler has ended
            while True:
                async with websockets.connect(f"{gateway.ws}/v1/stream") as ws:
                    if (await _first(ws))["type"] == "session.created":
                        break
                await asyncio.sleep(0.05)


async def test_a_session_saved_with_an_agent_this_gateway_lacks_resumes_with_its_own(
    bus: RedisSettings,
) -> None:
    agents = {**AGENTS, "concierge": EchoAgent}
    with ServerThread(create_app(_settings(bus), agents=agents)) as first:
        async with websockets.connect(f"{first.ws}/v1/stream") as ws:
            session_id = (await _first(ws))["session"]["id"]  # type: ignore[index]
            await ws.send(json.dumps({"type": "session.update", "session": {"agent": "concierge"}}))
            assert (await _first(ws))["type"] == "session.updated"
    with ServerThread(create_app(_settings(bus))) as second:  # no concierge here
        url = f"{second.ws}/v1/stream?session_id={session_id}"
        async with websockets.connect(url, max_queue=None) as ws:
            created = await _first(ws)
            session = created["session"]
            assert session["id"] == session_id and session["resumed"] is True  # type: ignore[index]
            assert session["agent"] == "echo"  # type: ignore[index]
            assert "'concierge' is not on this gateway" in str(created["notice"])
            await ws.send(json.dumps({"type": "conversation.text", "text": "hello again"}))
            async with asyncio.timeout(20):
                event: dict[str, object] = {}
                while event.get("type") != "response.done":
                    frame = await ws.recv()
                    if isinstance(frame, str):  # audio comes as binary frames
                        event = json.loads(frame)
                        assert event["type"] != "error", event
            assert event["status"] == "completed" and event["text"] == "hello again"


async def test_a_reconnect_takes_over_a_session_still_open_here(bus: RedisSettings) -> None:
    """A client whose network changed reconnects before the gateway saw its old socket die:
    the old connection is closed and the session, history included, goes on the new one
    (it was a new, empty session)."""
    app = create_app(_settings(bus))
    with ServerThread(app) as gateway:
        old = await websockets.connect(f"{gateway.ws}/v1/stream", max_queue=None)
        session_id = (await _first(old))["session"]["id"]  # type: ignore[index]
        await old.send(json.dumps({"type": "conversation.text", "text": "the blue door"}))
        async with asyncio.timeout(20):
            while not (isinstance(f := await old.recv(), str) and '"response.done"' in f):
                pass
        url = f"{gateway.ws}/v1/stream?session_id={session_id}"
        async with websockets.connect(url, max_queue=None) as new:
            session = (await _first(new))["session"]
            assert session["id"] == session_id and session["resumed"] is True  # type: ignore[index]
            history = app.state.sessions[session_id].history
            assert [(t.role, t.text) for t in history] == [
                ("user", "the blue door"),
                ("agent", "the blue door"),
            ]
            with pytest.raises(websockets.ConnectionClosed):
                async with asyncio.timeout(10):
                    while True:
                        await old.recv()
            assert old.close_code == 1000 and old.close_reason == "resumed on another connection"


async def test_an_anonymous_phone_stream_takes_no_seat_until_its_start_passes(
    bus: RedisSettings,
) -> None:
    """Authentication on: a `/v1/twilio` socket's credential comes in its `start`. Sockets
    that never send one took every seat of `max_sessions` (10 s each, reopened at will);
    they now take none, and only a few may wait at once."""
    auth = AuthSettings(required=True, token_secret=SecretStr(SECRET))
    section = GatewaySection(
        max_sessions=1,
        admission=AdmissionSettings(enabled=False),
        twilio=TwilioSettings(max_unverified=2),
    )
    settings = GatewaySettings(profile="fake", redis=bus, gateway=section, auth=auth)
    _, key = await new_key(bus, "acme")
    keyed = {"Authorization": f"Bearer {key}"}
    with ServerThread(create_app(settings)) as gateway:
        calls = [await websockets.connect(f"{gateway.ws}/v1/twilio") for _ in range(2)]
        async with websockets.connect(f"{gateway.ws}/v1/twilio") as third:  # one too many
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(third.recv(), 10)
            assert third.close_code == 1013
        assert await _admitted(gateway.http, keyed) == 0
        url = f"{gateway.ws}/v1/stream"
        async with websockets.connect(url, additional_headers=keyed) as ws:
            assert (await _first(ws))["type"] == "session.created"  # the seat was free
        async with asyncio.timeout(10):  # that session's seat is given back as it ends
            while await _admitted(gateway.http, keyed) > 0:
                await asyncio.sleep(0.02)
        # a stream whose start carries the key takes the seat
        start = {**START, "start": {**START["start"], "customParameters": {"token": key}}}  # type: ignore[dict-item]
        await calls[0].send(json.dumps(start))
        async with asyncio.timeout(10):
            while await _admitted(gateway.http, keyed) < 1:
                await asyncio.sleep(0.02)
        for call in calls:
            await call.close()
