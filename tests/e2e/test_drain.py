"""Draining a gateway (the Kubernetes preStop hook; SIGTERM: tests/e2e/test_sigterm.py):
/ready turns 503, new sessions are refused, a session between turns is closed with 1012 at
once, one in the middle of a turn when its turn is over (or when the grace period ends),
and they resume on another gateway."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import httpx
import pytest
import websockets
from redis.asyncio import Redis

from services.common.auth.credentials import is_loopback
from services.common.auth.guard import AuthGuard
from services.common.auth.settings import AuthSettings
from services.common.bus.settings import RedisSettings
from services.gateway.admission import AdmissionSettings
from services.gateway.app import create_app
from services.gateway.settings import GatewaySection, GatewaySettings
from services.ops.cli import main as cli_main
from services.ops.redis_server import free_port, start_redis
from services.tts.app import create_app as tts_app
from services.tts.settings import TtsSettings
from tests.conftest import RedisProc
from tests.servers import ServerThread


async def _open(url: str) -> tuple[websockets.ClientConnection, str]:
    ws = await websockets.connect(url)
    created = json.loads(await ws.recv())
    assert created["type"] == "session.created"
    return ws, created["session"]["id"]


UNMETERED = GatewaySection(admission=AdmissionSettings(enabled=False))  # a busy machine is not load
SAYING = "one two three four five six seven eight"  # 2.4 s of fake TTS audio


async def _answering(url: str) -> websockets.ClientConnection:
    """A session whose agent has started to speak (a response in flight)."""
    ws, _ = await _open(url)
    await ws.send(json.dumps({"type": "response.create", "text": SAYING}))
    while not isinstance(await asyncio.wait_for(ws.recv(), 10), bytes):
        pass  # until its first audio
    return ws


async def _until_closed(ws: websockets.ClientConnection) -> tuple[list[dict[str, object]], int]:
    """The events a session got until the server closed it, and the close code."""
    events = []
    with pytest.raises(websockets.ConnectionClosed) as closed:
        while True:
            message = await ws.recv()
            if isinstance(message, str):
                events.append(json.loads(message))
    assert closed.value.rcvd is not None
    return events, closed.value.rcvd.code


async def test_drain_closes_sessions_between_turns_with_1012_and_they_resume(
    redis_server: RedisProc,
) -> None:
    settings = GatewaySettings(profile="fake", redis=redis_server.settings(), gateway=UNMETERED)
    with (
        ServerThread(tts_app(TtsSettings(profile="fake", redis=settings.redis))),
        ServerThread(create_app(settings)) as gw,
        ServerThread(create_app(settings)) as other,
    ):
        url = f"{gw.ws}/v1/stream"
        resting, resting_id = await _open(url)
        answering = await _answering(url)
        leaves = await _answering(url)
        async with httpx.AsyncClient(base_url=gw.http) as http:
            assert (await http.get("/ready")).status_code == 200
            drain = asyncio.create_task(http.post("/admin/drain?grace_s=20&wait_s=5"))
            while (await http.get("/ready")).status_code != 503:
                pass  # the drain is under way
            async with websockets.connect(url) as late:
                error = json.loads(await late.recv())
                assert error["type"] == "error" and error["code"] == "capacity"
                assert error["retry_after_s"] == 1
            await leaves.close()  # ends by itself within the grace period
            assert (await _until_closed(resting))[1] == 1012  # between turns: closed at once
            events, code = await _until_closed(answering)
            assert code == 1012
            done = [e for e in events if e["type"] == "response.done"]
            assert [(d["status"], d["text"]) for d in done] == [("completed", SAYING)]
            reply = await drain
        assert reply.status_code == 200
        assert reply.json() == {
            "sessions_at_start": 3,
            "ended_in_grace": 1,
            "closed_1012": 2,
            "closed_mid_turn": 0,
            "remaining": 0,
        }
        # the closed session resumes on another gateway
        async with websockets.connect(f"{other.ws}/v1/stream?session_id={resting_id}") as again:
            created = json.loads(await again.recv())
            assert created["session"]["id"] == resting_id and created["session"]["resumed"]


async def test_a_turn_longer_than_the_grace_period_is_closed_mid_turn(
    redis_server: RedisProc,
) -> None:
    settings = GatewaySettings(profile="fake", redis=redis_server.settings(), gateway=UNMETERED)
    with (
        ServerThread(tts_app(TtsSettings(profile="fake", redis=settings.redis))),
        ServerThread(create_app(settings)) as gw,
    ):
        answering = await _answering(f"{gw.ws}/v1/stream")
        async with httpx.AsyncClient(base_url=gw.http) as http:
            reply = await http.post("/admin/drain?grace_s=0.3&wait_s=5")
        events, code = await _until_closed(answering)
        assert code == 1012 and not [e for e in events if e["type"] == "response.done"]
        assert reply.json()["closed_mid_turn"] == 1 and reply.json()["remaining"] == 0


def test_voice_agent_drain_cli(redis_server: RedisProc, capsys: pytest.CaptureFixture[str]) -> None:
    settings = GatewaySettings(profile="fake", redis=redis_server.settings())
    with ServerThread(create_app(settings)) as gw:
        cli_main(["drain", "--url", gw.http, "--grace", "0", "--wait", "1"])
        report = json.loads(capsys.readouterr().out)
        assert report["remaining"] == 0 and report["sessions_at_start"] == 0
        assert httpx.get(f"{gw.http}/ready").status_code == 503


def test_drain_cli_fails_when_no_gateway_answers() -> None:
    with pytest.raises(SystemExit) as stopped:
        cli_main(["drain", "--url", "http://127.0.0.1:9", "--grace", "0", "--wait", "0"])
    assert stopped.value.code == 1


@pytest.mark.parametrize(
    ("host", "local"),
    [("127.0.0.1", True), ("::1", True), ("10.0.0.7", False), ("testclient", False)],
)
def test_only_loopback_callers_may_drain(host: str, local: bool) -> None:
    assert is_loopback(host) is local


@pytest.mark.parametrize(
    ("client", "open_"), [(("127.0.0.1", 5000), True), (("10.0.0.7", 5000), False)]
)
def test_with_auth_on_the_drain_needs_no_key_from_this_host_only(
    client: tuple[str, int], open_: bool
) -> None:
    """The preStop hook has no key: the guard lets loopback callers reach /admin/drain."""
    redis = Redis.from_url("redis://127.0.0.1:1/0")  # never reached: no request is made
    guard = AuthGuard(None, AuthSettings(required=True), redis, "va", "gateway")  # type: ignore[arg-type]
    scope = {"type": "http", "path": "/admin/drain", "client": client}
    assert guard._open("/admin/drain", scope) is open_
    assert guard._open("/v1/stream", scope) is False


async def test_a_drain_with_redis_frozen_ends_when_its_sessions_are_closed(
    tmp_path: Path,
) -> None:
    """Redis stopped (SIGSTOP) under three open sessions: each gets its 1012 once its save
    has had its short wait, and the drain answers 200 with none left (it used to wait out
    `wait_s` and answer 504: each session's own last save, with no bound, came before it
    counted as closed)."""
    port = free_port()
    redis = start_redis(port, tmp_path)
    bus = RedisSettings(url=f"redis://127.0.0.1:{port}/0", prefix="frozen")
    settings = GatewaySettings(profile="fake", redis=bus, gateway=UNMETERED)
    try:
        with ServerThread(create_app(settings)) as gw:
            opened = [await _open(f"{gw.ws}/v1/stream") for _ in range(3)]
            os.kill(redis.pid, signal.SIGSTOP)
            async with httpx.AsyncClient(base_url=gw.http, timeout=120) as http:
                reply = await http.post("/admin/drain?grace_s=0.3&wait_s=60")
            assert reply.status_code == 200 and reply.json()["remaining"] == 0, reply.text
            for ws, _ in opened:
                assert (await _until_closed(ws))[1] == 1012
            os.kill(redis.pid, signal.SIGCONT)
    finally:
        os.kill(redis.pid, signal.SIGCONT)
        redis.kill()
        redis.wait(10)
