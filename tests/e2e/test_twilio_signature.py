"""`/v1/twilio` against anonymous sockets (fake engines, a real Redis, authentication on).

With Twilio's auth token configured, an upgrade without Twilio's `X-Twilio-Signature` of
the configured public URL is refused with 403 before the accept. Without it, sockets that
wait for their `start` are capped per peer address, so one host cannot fill the waiting
room and turn every caller away with 1013 (the reviewer's p08: 16 such sockets did)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import websockets
from websockets.asyncio.client import ClientConnection

from services.common import metrics as common_metrics
from services.gateway import metrics
from services.gateway.app import create_app as gateway_app
from services.gateway.settings import GatewaySection, GatewaySettings, TwilioSettings
from services.gateway.twilio_events import signature
from tests.conftest import RedisProc
from tests.e2e.test_auth import AUTH, new_key, refused_handshake
from tests.servers import ServerThread
from tests.twilio_call import TwilioCall

TWILIO_TOKEN = "twilio-auth-token-" + "7f" * 8
PUBLIC_URL = "wss://voice.example.test/v1/twilio"
"""What the TwiML's `<Stream url>` says: the gateway listens elsewhere (a proxy between)."""


@dataclass
class Gateways:
    signed: ServerThread
    """Twilio's auth token configured: upgrades must be signed."""
    signed_app: Any
    open: ServerThread
    """No Twilio auth token: anonymous upgrades wait, two per address at most."""
    open_app: Any
    key: str


@pytest.fixture(scope="module")
def gateways(redis_server: RedisProc) -> Iterator[Gateways]:
    redis = redis_server.settings()
    _, key = asyncio.run(new_key(redis, "acme"))

    def gateway(twilio: TwilioSettings) -> Any:
        section = GatewaySection(tts_url=None, twilio=twilio)
        return gateway_app(GatewaySettings(profile="fake", redis=redis, auth=AUTH, gateway=section))

    signed_app = gateway(
        TwilioSettings(auth_token=TWILIO_TOKEN, public_url=PUBLIC_URL, max_unverified_per_address=2)
    )
    open_app = gateway(TwilioSettings(max_unverified_per_address=2))
    with ServerThread(signed_app) as signed, ServerThread(open_app) as opened:
        yield Gateways(signed, signed_app, opened, open_app, key)


def _signed(url: str = PUBLIC_URL, token: str = TWILIO_TOKEN) -> dict[str, str]:
    return {"X-Twilio-Signature": signature(token, url)}


async def _answered(server: ServerThread, app: Any, call: TwilioCall) -> None:
    """The call gets a session of the key's tenant, and ends when it hangs up."""
    sessions: dict[str, Any] = app.state.sessions
    async with call:
        deadline = time.monotonic() + 10
        while not sessions:
            assert time.monotonic() < deadline, "no session"
            await asyncio.sleep(0.05)
        assert next(iter(sessions.values())).tenant == "acme"
        assert await call.stop() == 1000


async def _waiting(url: str, source: str = "127.0.0.1", **kwargs: Any) -> ClientConnection:
    """An upgraded socket that never sends `start`."""
    return await websockets.connect(
        url, open_timeout=10, local_addr=(source, 0), max_size=None, **kwargs
    )


@pytest.mark.parametrize(
    "url", [PUBLIC_URL, "wss://voice.example.test:443/v1/twilio"], ids=["as-written", "port"]
)
async def test_a_signed_upgrade_opens_the_call(gateways: Gateways, url: str) -> None:
    """Twilio has signed the URL with and without the default port: both pass."""
    call = TwilioCall(f"{gateways.signed.ws}/v1/twilio", {"token": gateways.key}, _signed(url))
    await _answered(gateways.signed, gateways.signed_app, call)


@pytest.mark.parametrize(
    ("headers", "query"),
    [
        ({}, ""),
        ({"X-Twilio-Signature": ""}, ""),
        ({"X-Twilio-Signature": "AAAAAAAAAAAAAAAAAAAAAAAAAAA="}, ""),
        (_signed(token="another-account-token"), ""),
        (_signed("wss://elsewhere.example.test/v1/twilio"), ""),
        (_signed(), "?x=1"),  # signed for the URL, not for this one
    ],
    ids=["none", "empty", "forged", "other-token", "other-url", "other-query"],
)
async def test_an_unsigned_upgrade_is_refused_before_any_session(
    gateways: Gateways, headers: dict[str, str], query: str
) -> None:
    refused = common_metrics.AUTH_REFUSED.labels("gateway", "forbidden")
    before = refused._value.get()
    url = f"{gateways.signed.ws}/v1/twilio{query}"
    status, body = await refused_handshake(url, additional_headers=headers)
    assert status == 403 and body["error"]["code"] == "forbidden"
    assert refused._value.get() == before + 1
    assert not gateways.signed_app.state.sessions


async def test_one_address_cannot_fill_the_waiting_room(gateways: Gateways) -> None:
    """Two sockets from one address wait for their start; a third from it is closed with
    1013 at once, while a call from another address is answered."""
    url = f"{gateways.open.ws}/v1/twilio"
    by_address = metrics.SESSIONS_REFUSED.labels("unverified_address")
    before = by_address._value.get()
    squatters = [await _waiting(url) for _ in range(2)]
    try:
        third = await _waiting(url)
        await asyncio.wait_for(third.wait_closed(), 3)  # not the 5 s start timeout
        assert third.close_code == 1013
        assert by_address._value.get() == before + 1
        assert all(squatter.close_code is None for squatter in squatters)
        call = TwilioCall(url, {"token": gateways.key}, source="127.0.0.2")
        await _answered(gateways.open, gateways.open_app, call)
    finally:
        for squatter in squatters:
            await squatter.close()


async def test_signed_upgrades_are_not_capped_per_address(gateways: Gateways) -> None:
    """Twilio's media servers open every call of a number from a few addresses: a signed
    upgrade waits whatever else from its address does."""
    url = f"{gateways.signed.ws}/v1/twilio"
    waiting = [await _waiting(url, additional_headers=_signed()) for _ in range(3)]
    try:
        call = TwilioCall(url, {"token": gateways.key}, _signed())
        await _answered(gateways.signed, gateways.signed_app, call)
        assert all(socket.close_code is None for socket in waiting)
    finally:
        for socket in waiting:
            await socket.close()
