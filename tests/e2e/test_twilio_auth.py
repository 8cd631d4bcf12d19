"""`/v1/twilio` with authentication on (fake engines, a real Redis): Twilio sends no headers,
so the credential comes in the stream's `start`, as a custom parameter (`<Parameter
name="token">`). No credential, no service: no session, the socket closed with 1008."""

from __future__ import annotations

import asyncio
import importlib.util
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import httpx
import pytest

from services.common import metrics as common_metrics
from tests.conftest import RedisProc
from tests.e2e.test_auth import AuthStack, bearer, start_auth_stack
from tests.twilio_call import TwilioCall


@pytest.fixture(scope="module")
def stack(redis_server: RedisProc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthStack]:
    with start_auth_stack(redis_server.settings(), tmp_path_factory.mktemp("voices")) as started:
        yield started


def _url(stack: AuthStack) -> str:
    return f"{stack.gateway.ws}/v1/twilio"


def _sessions(stack: AuthStack) -> dict[str, Any]:
    sessions: dict[str, Any] = stack.gateway_app.state.sessions
    return sessions


async def _closed(call: TwilioCall) -> int | None:
    assert call.ws is not None
    await asyncio.wait_for(call.ws.wait_closed(), 15)
    return call.ws.close_code


@pytest.mark.parametrize("parameters", [{}, {"token": "va_nope"}, {"other": "x"}])
async def test_no_credential_no_service(stack: AuthStack, parameters: dict[str, str]) -> None:
    refused = common_metrics.AUTH_REFUSED.labels("gateway", "unauthorized")
    before = refused._value.get()
    async with TwilioCall(_url(stack), parameters) as call:
        assert await _closed(call) == 1008
    assert refused._value.get() == before + 1
    assert not _sessions(stack)


async def _answered(stack: AuthStack, token: str) -> None:
    async with TwilioCall(_url(stack), {"token": token}) as call:
        deadline = time.monotonic() + 10
        while not _sessions(stack):
            assert time.monotonic() < deadline, "no session"
            await asyncio.sleep(0.05)
        session = next(iter(_sessions(stack).values()))
        assert session.tenant == "acme"
        assert await call.stop() == 1000


async def test_an_api_key_or_a_client_token_in_the_start_opens_the_call(stack: AuthStack) -> None:
    await _answered(stack, stack.key)
    async with httpx.AsyncClient(timeout=10) as http:
        url = f"{stack.gateway.http}/v1/sessions"
        issued = await http.post(url, json={"expires_in": 60}, headers=bearer(stack.key))
    await _answered(stack, issued.json()["token"])


async def test_the_example_webhook_answers_with_twiml_whose_token_opens_the_call(
    stack: AuthStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """examples/twilio/answer.py, as docs/telephony.md tells a user to run it."""
    spec = importlib.util.spec_from_file_location(
        "twilio_answer", Path(__file__).parents[2] / "examples/twilio/answer.py"
    )
    assert spec is not None and spec.loader is not None
    answer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(answer)
    monkeypatch.setattr(answer, "GATEWAY", stack.gateway.http)
    monkeypatch.setattr(answer, "KEY", stack.key)
    twiml = ElementTree.fromstring(await asyncio.to_thread(answer.twiml))
    stream = twiml.find("./Connect/Stream")
    assert stream is not None and stream.get("url") == f"{stack.gateway.ws}/v1/twilio"
    parameter = stream.find("./Parameter[@name='token']")
    assert parameter is not None
    await _answered(stack, parameter.get("value", ""))
