"""Abuse limits live in Redis, so two gateway processes on one Redis share them: concurrent
sessions, new sessions per minute and REST requests per minute of one tenant, counted
across both; a lease left by a crashed process expires."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from websockets.exceptions import InvalidStatus

from services.common.auth.limits import Limiter
from services.common.auth.settings import AuthSettings, Limits
from services.common.bus.connection import connect as redis_connect
from services.common.bus.settings import RedisSettings
from services.common.errors import RateLimited
from services.gateway.app import create_app
from services.gateway.settings import GatewaySettings
from tests.conftest import RedisProc
from tests.e2e.test_auth import bearer, new_key, refused_handshake, session
from tests.servers import ServerThread

AUTH = AuthSettings(required=True, token_secret=SecretStr("limits-test-secret-" + "q" * 32))


class Gateways:
    def __init__(self, redis: RedisSettings, servers: list[ServerThread], apps: list[Any]):
        self.redis = redis
        self.servers = servers
        self.apps = apps

    def ws(self, i: int) -> str:
        return f"{self.servers[i % 2].ws}/v1/stream"

    def http(self, i: int) -> str:
        return f"{self.servers[i % 2].http}/v1/sessions"

    async def live(self, tenant: str) -> int:
        client = redis_connect(self.redis)
        try:
            return await Limiter(client, self.redis.prefix).live_sessions(tenant)
        finally:
            await client.aclose()


@pytest.fixture(scope="module")
def gateways(redis_server: RedisProc) -> Iterator[Gateways]:
    redis = redis_server.settings()
    apps = [create_app(GatewaySettings(profile="fake", redis=redis, auth=AUTH)) for _ in "ab"]
    with ServerThread(apps[0]) as first, ServerThread(apps[1]) as second:
        yield Gateways(redis, [first, second], apps)


async def test_concurrent_sessions_are_counted_across_gateways(gateways: Gateways) -> None:
    _, key = await new_key(gateways.redis, "conc", sessions=2)
    headers = bearer(key)
    async with (
        session(gateways.ws(0), additional_headers=headers) as (first, _),
        session(gateways.ws(1), additional_headers=headers),
    ):
        for i in range(2):
            status, body = await refused_handshake(gateways.ws(i), additional_headers=headers)
            assert (status, body["error"]["code"]) == (429, "rate_limited")
        await first.close()
        deadline = time.monotonic() + 10
        while await gateways.live("conc") > 1:  # the gateway releases it as the session ends
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        async with session(gateways.ws(1), additional_headers=headers) as (_, created):
            assert created["type"] == "session.created"


async def test_new_sessions_per_minute_across_gateways(gateways: Gateways) -> None:
    _, key = await new_key(gateways.redis, "burst", sessions_per_minute=3)
    for i in range(3):
        async with session(gateways.ws(i), additional_headers=bearer(key)) as (_, created):
            assert created["type"] == "session.created"
    with pytest.raises(InvalidStatus) as refused:
        async with session(gateways.ws(3), additional_headers=bearer(key)):
            pass
    response = refused.value.response
    assert response.status_code == 429
    assert 1 <= int(response.headers["Retry-After"]) <= 60


async def test_rest_requests_per_minute_across_gateways(gateways: Gateways) -> None:
    _, key = await new_key(gateways.redis, "chatty", requests_per_minute=4)
    async with httpx.AsyncClient(timeout=10) as http:
        for i in range(4):
            ok = await http.post(gateways.http(i), json={}, headers=bearer(key))
            assert ok.status_code == 200, ok.text
        over = await http.post(gateways.http(4), json={}, headers=bearer(key))
    assert over.status_code == 429 and over.json()["error"]["code"] == "rate_limited"
    assert 1 <= int(over.headers["Retry-After"]) <= 60
    _, other = await new_key(gateways.redis, "quiet", requests_per_minute=4)
    async with httpx.AsyncClient(timeout=10) as http:  # another tenant is not affected
        assert (await http.post(gateways.http(0), headers=bearer(other))).status_code == 200


async def test_a_crashed_process_lease_expires(redis_server: RedisProc) -> None:
    redis = redis_server.settings()
    client = redis_connect(redis)
    try:
        limiter = Limiter(client, redis.prefix)
        await limiter.open_session("t", 1, "alive")
        with pytest.raises(RateLimited):
            await limiter.open_session("t", 1, "second")
        now = int((await client.time())[0])
        await client.zadd(f"{redis.prefix}:auth:live:t", {"alive": now - 1})  # lease ran out
        await limiter.open_session("t", 1, "second")
        assert await limiter.live_sessions("t") == 1
    finally:
        await client.aclose()


def test_limits_of_a_key_fall_back_to_the_defaults() -> None:
    mine = Limits(sessions=2).over(Limits(sessions=20, requests_per_minute=600))
    assert (mine.sessions, mine.requests_per_minute) == (2, 600)
