"""`/v1/twilio` with authentication on (fake engines, a real Redis): Twilio sends no headers,
so the credential comes in the stream's `start`, as a custom parameter (`<Parameter
name="token">`). No credential, no service: no session, the socket closed with 1008."""

from __future__ import annotations

import asyncio
import importlib.util
import threading
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


def _example() -> Any:
    spec = importlib.util.spec_from_file_location(
        "twilio_answer", Path(__file__).parents[2] / "examples/twilio/answer.py"
    )
    assert spec is not None and spec.loader is not None
    answer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(answer)
    return answer


def test_the_example_webhook_signs_as_twilio_does() -> None:
    """Twilio's published vector (its helper libraries' tests): token 12345, this URL and
    these fields give this signature."""
    answer = _example()
    url = "https://mycompany.com/myapp.php?foo=1&bar=2"
    fields = {
        "CallSid": "CA1234567890ABCDE",
        "Caller": "+14158675309",
        "Digits": "1234",
        "From": "+14158675309",
        "To": "+18005551212",
    }
    assert answer.signature(url, fields, "12345") == "RSOYDt4T1cUTdK1PDd93/VVr8B8="
    assert answer.signed_by_twilio(url, fields, "RSOYDt4T1cUTdK1PDd93/VVr8B8=", "12345")
    assert not answer.signed_by_twilio(
        url, {**fields, "Digits": "9"}, "RSOYDt4T1cUTdK1PDd93/VVr8B8=", "12345"
    )
    assert not answer.signed_by_twilio(url, fields, "", "")  # no auth token: nothing passes


async def test_the_example_webhook_gives_a_token_to_twilio_only(
    stack: AuthStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unsigned POST (anyone who found the webhook) got a client token of the key's
    tenant, good on /v1/stream too; it is refused now, and a signed one is answered."""
    answer = _example()
    monkeypatch.setattr(answer, "GATEWAY", stack.gateway.http)
    monkeypatch.setattr(answer, "KEY", stack.key)
    monkeypatch.setattr(answer, "TWILIO_AUTH_TOKEN", "twilio-token")
    server = answer.HTTPServer(("127.0.0.1", 0), answer.Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/answer"
    fields = {"CallSid": "CA1", "From": "+15550100"}
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            unsigned = await http.post(url, data=fields)
            forged = await http.post(url, data=fields, headers={"X-Twilio-Signature": "AAAA"})
            signed = await http.post(
                url,
                data=fields,
                headers={"X-Twilio-Signature": answer.signature(url, fields, "twilio-token")},
            )
    finally:
        server.shutdown()
        server.server_close()
    assert (unsigned.status_code, forged.status_code) == (403, 403)
    assert "token" not in unsigned.text
    assert signed.status_code == 200 and '<Parameter name="token"' in signed.text


async def test_the_example_webhook_answers_with_twiml_whose_token_opens_the_call(
    stack: AuthStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """examples/twilio/answer.py, as docs/telephony.md tells a user to run it."""
    answer = _example()
    monkeypatch.setattr(answer, "GATEWAY", stack.gateway.http)
    monkeypatch.setattr(answer, "KEY", stack.key)
    twiml = ElementTree.fromstring(await asyncio.to_thread(answer.twiml))
    stream = twiml.find("./Connect/Stream")
    assert stream is not None and stream.get("url") == f"{stack.gateway.ws}/v1/twilio"
    parameter = stream.find("./Parameter[@name='token']")
    assert parameter is not None
    await _answered(stack, parameter.get("value", ""))
