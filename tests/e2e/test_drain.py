"""Draining a gateway (the Kubernetes preStop hook): /ready turns 503, new sessions are
refused, a session that ends in the grace period is let be, the rest close with 1012 and
resume on another gateway."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import websockets
from redis.asyncio import Redis

from services.common.auth.credentials import is_loopback
from services.common.auth.guard import AuthGuard
from services.common.auth.settings import AuthSettings
from services.gateway.app import create_app
from services.gateway.settings import GatewaySettings
from services.ops.cli import main as cli_main
from tests.conftest import RedisProc
from tests.servers import ServerThread


async def _open(url: str) -> tuple[websockets.ClientConnection, str]:
    ws = await websockets.connect(url)
    created = json.loads(await ws.recv())
    assert created["type"] == "session.created"
    return ws, created["session"]["id"]


async def test_drain_closes_sessions_with_1012_and_they_resume(redis_server: RedisProc) -> None:
    settings = GatewaySettings(profile="fake", redis=redis_server.settings())
    with ServerThread(create_app(settings)) as gw, ServerThread(create_app(settings)) as other:
        url = f"{gw.ws}/v1/stream"
        stays, stays_id = await _open(url)
        leaves, _ = await _open(url)
        async with httpx.AsyncClient(base_url=gw.http) as http:
            assert (await http.get("/ready")).status_code == 200
            drain = asyncio.create_task(http.post("/admin/drain?grace_s=1.5&wait_s=5"))
            await asyncio.sleep(0.3)  # the drain is under way (grace period)
            assert (await http.get("/ready")).status_code == 503
            async with websockets.connect(url) as late:
                error = json.loads(await late.recv())
                assert error["type"] == "error" and error["code"] == "capacity"
            await leaves.close()  # ends by itself within the grace period
            with pytest.raises(websockets.ConnectionClosed) as closed:
                while True:
                    await stays.recv()
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.code == 1012
            reply = await drain
        assert reply.status_code == 200
        assert reply.json() == {
            "sessions_at_start": 2,
            "ended_in_grace": 1,
            "closed_1012": 1,
            "remaining": 0,
        }
        # the closed session resumes on another gateway
        async with websockets.connect(f"{other.ws}/v1/stream?session_id={stays_id}") as again:
            created = json.loads(await again.recv())
            assert created["session"]["id"] == stays_id and created["session"]["resumed"]


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
