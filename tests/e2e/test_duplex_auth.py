"""Authentication through the gateway to the duplex service, both with it on: the caller's
tenant goes behind the gateway as a relay token (services/common/auth/relay.py), so the
duplex service checks it, and the tenant's session and audio are counted once."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import websockets
from pydantic import SecretStr

from services.common.audio.pcm import float_to_pcm16
from services.common.auth.credentials import TOKEN_SUBPROTOCOL, sign_token
from services.common.auth.limits import Limiter
from services.common.auth.settings import AuthSettings, DefaultLimits
from services.common.bus.connection import connect as redis_connect
from services.common.bus.settings import RedisSettings
from services.gateway.app import create_app as gateway_app
from services.gateway.settings import GatewaySection, GatewaySettings
from tests.conftest import RedisProc
from tests.duplex_client import duplex_server
from tests.duplex_gateway import DuplexStack, duplex_stack, session, stream
from tests.e2e.test_auth import new_key
from tests.servers import ServerThread

SECRET = "duplex-relay-secret-" + "Kp4" * 12
AUTH = AuthSettings(
    required=True,
    token_secret=SecretStr(SECRET),
    limits=DefaultLimits(sessions=50, sessions_per_minute=10_000, requests_per_minute=10_000),
)


@pytest.fixture(scope="module")
def stack(redis_server: RedisProc) -> Iterator[DuplexStack]:
    with duplex_stack(redis_server.settings(), auth=AUTH, max_sessions=4) as started:
        yield started


async def _used(redis: RedisSettings, tenant: str) -> tuple[int, int]:
    """(live sessions, audio ms used today) of `tenant`."""
    client = redis_connect(redis)
    try:
        limiter = Limiter(client, redis.prefix)
        return await limiter.live_sessions(tenant), await limiter.audio_used_ms(tenant)
    finally:
        await client.aclose()


def _bearer(credential: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}"}


async def test_a_tenant_with_one_session_gets_it_and_its_audio_counts_once(
    stack: DuplexStack,
    one_utc_day: None,
) -> None:
    redis = stack.redis
    _, key = await new_key(redis, "onesession", sessions=1)
    seconds = 3
    async with session(stack.stream_url, additional_headers=_bearer(key)) as client:
        await client.event("response.created")
        # one lease: the duplex service took the relay token without counting it again
        assert (await _used(redis, "onesession"))[0] == 1
        pcm = float_to_pcm16(np.full(16000 * seconds, 0.05, np.float32))
        await stream(client.ws, pcm, 16000)
        await client.until(lambda: client.samples().size >= 24000 * (seconds - 0.2))
        # every frame handled before the session ends (a close drops what the session has
        # read ahead and not handled yet: neither sent to the model nor charged)
        await client.send({"type": "session.close"})
        await client.closed()
    async with asyncio.timeout(10):  # the lease goes once the audio is charged
        while (await _used(redis, "onesession"))[0]:
            await asyncio.sleep(0.02)
    assert (await _used(redis, "onesession"))[1] == seconds * 1000


async def test_a_client_token_opens_a_duplex_session(stack: DuplexStack) -> None:
    _, key = await new_key(stack.redis, "tokenco")
    token = httpx.post(
        f"{stack.gateway.http}/v1/sessions", headers=_bearer(key), timeout=10
    ).json()["token"]
    protocols = ["voice-agent.v1", f"{TOKEN_SUBPROTOCOL}{token}"]
    async with session(stack.stream_url, subprotocols=protocols) as client:
        await client.event("response.created")
        await stream(client.ws, float_to_pcm16(np.full(1920 * 3, 0.1, np.float32)), 24000)
        await client.until(lambda: client.samples().size > 0)


async def test_relay_tokens_are_for_the_service_behind_not_the_gateway(
    stack: DuplexStack,
) -> None:
    key_id, _ = await new_key(stack.redis, "relayco")
    relay, _ = sign_token(SECRET.encode(), "relayco", key_id, 60, {}, relay=True)
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with session(stack.stream_url, additional_headers=_bearer(relay)):
            pass
    assert refused.value.response.status_code == 401
    with pytest.raises(websockets.InvalidStatus):  # no credential at all
        async with session(stack.stream_url):
            pass
    # the duplex service takes it, and it cannot buy a client token with it
    async with session(
        f"{stack.duplex.ws}/v1/stream/duplex", additional_headers=_bearer(relay)
    ) as direct:
        assert (await direct.event("ready"))["engine"] == "fake"
    minted = httpx.post(f"{stack.duplex.http}/v1/sessions", headers=_bearer(relay), timeout=10)
    assert minted.status_code == 403


async def test_a_duplex_service_with_another_secret_is_a_clear_error(
    redis_server: RedisProc,
) -> None:
    redis = redis_server.settings()
    other = AUTH.model_copy(update={"token_secret": SecretStr("another-secret-" + "x" * 32)})
    with duplex_server(redis, auth=other, engine="fake") as service:
        section = GatewaySection(backend="duplex", duplex_url=service.ws, end_of_turn="silence")
        app = gateway_app(GatewaySettings(redis=redis, auth=AUTH, gateway=section))
        with ServerThread(app) as gateway:
            _, key = await new_key(redis, "mismatch")
            async with session(f"{gateway.ws}/v1/stream", additional_headers=_bearer(key)) as c:
                await c.closed()
    assert c.ws.close_code == 1011
    error = c.events[0]
    assert (error["type"], error["code"]) == ("error", "duplex_unavailable")
    assert "VA_AUTH__TOKEN_SECRET" in error["message"] and "401" in error["message"]
