"""The door's answers to a security review, on real servers (fake engines, a real Redis):
what a client token may not do (change the voice library), a revoked key ending the
connections it opened, DNS rebinding and cross-site requests (with authentication off and
on), /admin/drain behind a proxy or from a page, API keys in URLs, credentials hidden from
the logs by percent-encoding, and the body limits of the JSON endpoints."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import os
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from services.common.auth.api_keys import KeyStore
from services.common.auth.credentials import APP_SUBPROTOCOL, TOKEN_SUBPROTOCOL
from services.common.auth.settings import AuthSettings
from services.common.bus.connection import connect as redis_connect
from services.common.redact import install_redaction
from services.gateway.app import create_app as gateway_app
from services.gateway.settings import GatewaySettings
from services.tts.app import create_app as tts_app
from services.tts.settings import TtsSection, TtsSettings, VoiceLibrarySettings
from tests.component.test_voice_library import GOOD
from tests.conftest import RedisProc
from tests.e2e.test_auth import (
    AUTH,
    ORIGIN,
    AuthStack,
    bearer,
    new_key,
    refused_handshake,
    revoke,
    session,
    start_auth_stack,
)
from tests.servers import ServerThread

FAST = AUTH.model_copy(update={"lease_renew_s": 0.5})
"""Leases renewed (and keys checked again) every half second, not every 20 s."""
EVIL = "https://evil.example"


@pytest.fixture(scope="module")
def stack(redis_server: RedisProc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthStack]:
    voices = tmp_path_factory.mktemp("voices")
    with start_auth_stack(redis_server.settings(), voices, FAST) as started:
        yield started


@pytest.fixture(scope="module")
def open_tts(redis_server: RedisProc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A TTS service with authentication off (what `voice-agent up` runs on loopback)."""
    settings = TtsSettings(
        profile="fake",
        redis=redis_server.settings(),
        auth=AuthSettings(required=False, allowed_origins=["http://agent.example.org:8080"]),
        tts=TtsSection(voices=VoiceLibrarySettings(dir=tmp_path_factory.mktemp("open"))),
    )
    with ServerThread(tts_app(settings)) as server:
        yield server


async def mint(stack: AuthStack, key: str) -> str:
    async with httpx.AsyncClient(timeout=10) as http:
        reply = await http.post(f"{stack.gateway.http}/v1/sessions", headers=bearer(key), json={})
        assert reply.status_code == 200, reply.text
        token: str = reply.json()["token"]
        return token


def token_protocols(token: str) -> Any:
    return [APP_SUBPROTOCOL, TOKEN_SUBPROTOCOL + token]


async def test_a_client_token_cannot_change_the_voice_library(stack: AuthStack) -> None:
    """A browser's token uses the tenant's voices; adding or deleting one needs the key."""
    voices = f"{stack.tts.http}/v1/voices"
    token = await mint(stack, stack.key)
    async with httpx.AsyncClient(timeout=30) as http:
        upload = {"files": {"file": ("a.wav", GOOD, "audio/wav")}, "data": {"name": "ceo"}}
        made = await http.post(voices, headers=bearer(stack.key), **upload)  # type: ignore[arg-type]
        assert made.status_code == 201
        voice_id = made.json()["id"]
        planted = await http.post(voices, headers=bearer(token), **upload)  # type: ignore[arg-type]
        deleted = await http.delete(f"{voices}/{voice_id}", headers=bearer(token))
        for refused in (planted, deleted):
            assert refused.status_code == 403, refused.text
            assert refused.json()["error"]["code"] == "forbidden"
            assert "needs an API key" in refused.json()["error"]["message"]
        listed = await http.get(voices, headers=bearer(token))
        assert listed.status_code == 200 and voice_id in listed.text
        removed = await http.delete(f"{voices}/{voice_id}", headers=bearer(stack.key))
        assert removed.status_code == 200


async def test_a_client_token_reopens_sessions_until_it_expires(stack: AuthStack) -> None:
    """Not single-use: the page reconnects (and resumes) with the token it has. (A second
    session rather than a resume of the first: whether a resume finds the first one's
    record depends on when its save lands, which tests/e2e/test_resume.py waits for.)"""
    token = await mint(stack, stack.key)
    url = f"{stack.gateway.ws}/v1/stream"
    async with session(url, subprotocols=token_protocols(token)) as (_, first):
        assert first["type"] == "session.created"
    async with session(url, subprotocols=token_protocols(token)) as (_, again):
        assert again["type"] == "session.created"
        assert again["session"]["id"] != first["session"]["id"]


async def until_closed(ws: ClientConnection) -> list[dict[str, Any]]:
    """The text events a connection gets until it is closed (within 10 s)."""
    events: list[dict[str, Any]] = []
    async with asyncio.timeout(10):
        try:
            while True:
                message = await ws.recv()
                if isinstance(message, str):
                    events.append(json.loads(message))
        except ConnectionClosed:
            return events


async def test_revoking_a_key_ends_the_connections_it_opened(stack: AuthStack) -> None:
    """The key's own sessions and those of its tokens end (fatal `unauthorized`, 1008)
    within a renewal period; another key's session of the same tenant goes on."""
    key_id, key = await new_key(stack.redis, "revoked-co")
    _, other_key = await new_key(stack.redis, "revoked-co")
    token = await mint(stack, key)
    gateway, tts = f"{stack.gateway.ws}/v1/stream", f"{stack.tts.ws}/v1/stream/tts"
    async with (
        session(gateway, additional_headers=bearer(key)) as (by_key, _),
        session(gateway, subprotocols=token_protocols(token)) as (by_token, _),
        session(tts, additional_headers=bearer(key)) as (tts_stream, ready),
        session(gateway, additional_headers=bearer(other_key)) as (unrelated, _),
    ):
        assert ready["type"] == "ready"
        await revoke(stack.redis, key_id)
        for ws in (by_key, by_token, tts_stream):
            events = await until_closed(ws)
            assert events[-1]["type"] == "error", events
            assert (events[-1]["code"], events[-1]["fatal"]) == ("unauthorized", True)
            assert ws.close_code == 1008 and ws.close_reason == "unauthorized"
        await unrelated.send(json.dumps({"type": "conversation.text", "text": "still here"}))
        async with asyncio.timeout(10):
            while not (isinstance(m := await unrelated.recv(), str) and "response.created" in m):
                pass


async def test_a_key_record_lost_with_redis_is_not_a_revocation(stack: AuthStack) -> None:
    """A Redis that lost a key's record (restarted empty, a replica promoted without it)
    does not end the key's open connections: only a revocation does (the next upgrade
    checks the key again)."""
    key_id, key = await new_key(stack.redis, "lost-co")
    async with session(f"{stack.gateway.ws}/v1/stream", additional_headers=bearer(key)) as (
        ws,
        _,
    ):
        client = redis_connect(stack.redis)
        try:
            await client.delete(KeyStore(client, stack.redis.prefix)._key(key_id))
        finally:
            await client.aclose()
        await asyncio.sleep(2.0)  # four renewals (FAST): a wait for what must not happen
        await ws.send(json.dumps({"type": "conversation.text", "text": "still here"}))
        async with asyncio.timeout(10):
            while not (isinstance(m := await ws.recv(), str) and "response.created" in m):
                pass


def raw_upgrade(port: int, host: str, origin: str | None, path: str = "/v1/stream/tts") -> str:
    """The status line a WebSocket upgrade gets, sent with exactly this Host and Origin
    (what a browser sends after DNS rebinding)."""
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [
        f"GET {path} HTTP/1.1",
        f"Host: {host}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
    ]
    lines += [f"Origin: {origin}"] if origin else []
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        return sock.recv(4096).decode(errors="replace").split("\r\n")[0]


def test_with_auth_off_a_rebound_dns_name_is_refused(open_tts: ServerThread) -> None:
    port = open_tts.port
    rebound = f"rebind.evil.example:{port}"
    assert " 403 " in raw_upgrade(port, rebound, f"http://{rebound}")
    assert " 403 " in raw_upgrade(port, rebound, None)
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"):
        assert " 101 " in raw_upgrade(port, host, f"http://{host}"), host
    listed = "agent.example.org:8080"  # the host of an allowed origin
    assert " 101 " in raw_upgrade(port, listed, f"http://{listed}")
    health = httpx.get(f"{open_tts.http}/health", headers={"Host": rebound}, timeout=10)
    assert health.status_code == 403 and health.json()["error"]["code"] == "forbidden"


async def test_cross_site_posts_are_refused(stack: AuthStack, open_tts: ServerThread) -> None:
    """A page's POST needs no preflight when its body is a form: the Origin is checked on
    every state-changing request, with authentication off and on."""
    upload = {"files": {"file": ("a.wav", GOOD, "audio/wav")}, "data": {"name": "planted"}}
    async with httpx.AsyncClient(timeout=30) as http:
        url = f"{open_tts.http}/v1/voices"
        refused = await http.post(url, headers={"Origin": EVIL}, **upload)  # type: ignore[arg-type]
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
        assert "planted" not in (await http.get(url)).text
        made = await http.post(url, **upload)  # type: ignore[arg-type]
        assert made.status_code == 201  # a client that is not a browser
        assert (await http.get(url, headers={"Origin": EVIL})).status_code == 200  # reads
        key = bearer(stack.key)
        url = f"{stack.gateway.http}/v1/sessions"
        assert (await http.post(url, headers={**key, "Origin": EVIL}, json={})).status_code == 403
        assert (await http.post(url, headers={**key, "Origin": ORIGIN}, json={})).status_code == 200


@pytest.fixture
def gateway(redis_server: RedisProc) -> Iterator[ServerThread]:
    """A gateway of its own (auth on): the drain test drains it."""
    app = gateway_app(GatewaySettings(profile="fake", redis=redis_server.settings(), auth=FAST))
    with ServerThread(app) as server:
        yield server


def test_drain_is_refused_to_pages_and_through_proxies(gateway: ServerThread) -> None:
    """uvicorn takes the client's address from X-Forwarded-For when the peer is trusted
    (127.0.0.1 by default, `*` in many containers): a forwarded request, or a page in a
    browser on the host (loopback too, but it sends an Origin), must not drain."""
    url = f"{gateway.http}/admin/drain?grace_s=0&wait_s=0"
    for headers in (
        {"X-Forwarded-For": "127.0.0.1"},
        {"Forwarded": "for=127.0.0.1"},
        {"X-Real-IP": "127.0.0.1"},
        {"Origin": EVIL, "Content-Type": "text/plain"},
        {"Origin": gateway.http},
    ):
        refused = httpx.post(url, headers=headers, timeout=10)
        assert refused.status_code == 403, (headers, refused.text)
        assert refused.json()["error"]["code"] == "forbidden"
    assert httpx.get(f"{gateway.http}/ready", timeout=10).status_code == 200  # not draining
    assert httpx.post(url, timeout=10).status_code == 200  # the operator's own CLI


async def test_an_api_key_is_refused_in_the_url(stack: AuthStack) -> None:
    url = f"{stack.gateway.ws}/v1/stream"
    encoded = stack.key.replace("_", "%5F")
    for query in (f"access_token={stack.key}", f"access%5Ftoken={encoded}"):
        status, body = await refused_handshake(f"{url}?{query}")
        assert status == 401 and "may not travel in the URL" in body["error"]["message"]
    token = await mint(stack, stack.key)
    async with session(f"{url}?access_token={token}") as (_, created):
        assert created["type"] == "session.created"


@pytest.fixture
def uvicorn_log() -> Iterator[io.StringIO]:
    """What uvicorn logs at INFO (each handshake's line), through the services' filter."""
    install_redaction()
    logger, captured = logging.getLogger("uvicorn.error"), io.StringIO()
    handler, level = logging.StreamHandler(captured), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield captured
    logger.setLevel(level)
    logger.removeHandler(handler)


async def test_a_percent_encoded_token_stays_out_of_the_log(
    stack: AuthStack, uvicorn_log: io.StringIO
) -> None:
    token = await mint(stack, stack.key)
    query = "access%5Ftoken=" + token.replace(".", "%2E")
    async with session(f"{stack.gateway.ws}/v1/stream?{query}") as (_, created):
        assert created["type"] == "session.created"
    logged = uvicorn_log.getvalue()
    assert '"WebSocket /v1/stream?[redacted]"' in logged
    assert token.split(".")[2] not in logged and token.split(".")[1] not in logged


async def chunks(body: bytes, size: int = 64 * 1024) -> AsyncIterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


async def test_json_bodies_are_limited(stack: AuthStack) -> None:
    """`/v1/audio/speech` and `/v1/sessions` (every service) answer 413 past their limit,
    declared or sent chunked, before the body is read whole."""
    speech = f"{stack.tts.http}/v1/audio/speech"
    headers = {**bearer(stack.key), "Content-Type": "application/json"}
    huge = b'{"input":"' + b"a" * (1 << 20) + b'","voice":"default"}'
    async with httpx.AsyncClient(timeout=30) as http:
        for url in (speech, *(f"{s.http}/v1/sessions" for s in (stack.gateway, stack.asr))):
            for content in (huge, chunks(huge)):
                reply = await http.post(url, headers=headers, content=content)
                assert reply.status_code == 413, (url, reply.text)
                assert "exceeds the limit" in reply.json()["error"]["message"]
                assert reply.json()["error"]["code"] == "invalid_message"  # not audio
        longest = {"input": "\u00e9" * 4096, "voice": "default", "response_format": "wav"}
        raw = json.dumps(longest).encode()  # ASCII escapes: 6 bytes a character
        assert (await http.post(speech, headers=headers, content=raw)).status_code == 200
        token = {"expires_in": 60, "session": {"instructions": "\U0001f600" * 16_384}}
        raw = json.dumps(token).encode()  # 12 bytes a character: the most there is
        reply = await http.post(f"{stack.tts.http}/v1/sessions", headers=headers, content=raw)
        assert reply.status_code == 200, reply.text
        malformed = await http.post(speech.replace("audio/speech", "sessions"), headers=headers)
        assert malformed.status_code == 200  # no body: the defaults
        bad = await http.post(
            f"{stack.tts.http}/v1/sessions", headers=headers, content=b'{"expires_in": 1}'
        )
        assert bad.status_code == 400 and "expires_in" in bad.json()["error"]["message"]
