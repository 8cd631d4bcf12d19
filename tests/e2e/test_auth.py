"""Authentication on real servers (fake engines, a real Redis): every entry point refuses a
missing, wrong, expired or revoked credential before any work; client tokens; the Origin
allow-list; tenant isolation of sessions; jobs carry the tenant; limits shared by two
gateway processes; the daily audio quota."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import websockets
from openai import AuthenticationError, OpenAI
from pydantic import SecretStr
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from services.asr.app import create_app as asr_app
from services.asr.settings import AsrSettings
from services.client.stream import StreamClient
from services.common.audio.pcm import encode_audio
from services.common.auth import credentials as auth
from services.common.auth.api_keys import KeyStore
from services.common.auth.credentials import sign_token
from services.common.auth.settings import AuthSettings, DefaultLimits, Limits
from services.common.bus.connection import connect as redis_connect
from services.common.bus.keys import Keys
from services.common.bus.settings import RedisSettings
from services.gateway.app import create_app as gateway_app
from services.gateway.settings import GatewaySection, GatewaySettings
from services.tts.app import create_app as tts_app
from services.tts.settings import TtsSection, TtsSettings, VoiceLibrarySettings
from tests.component.test_voice_library import GOOD
from tests.conftest import RedisProc
from tests.e2e.wire import recv_until
from tests.servers import ServerThread

SECRET = "test-signing-secret-" + "Zq8" * 12
ORIGIN = "https://app.example.com"
AUTH = AuthSettings(
    required=True,
    token_secret=SecretStr(SECRET),
    allowed_origins=[ORIGIN],
    protect_ops=True,
    limits=DefaultLimits(
        sessions=50,
        sessions_per_minute=10_000,
        requests_per_minute=10_000,
        audio_seconds_per_day=100_000,
    ),
)


async def new_key(redis: RedisSettings, tenant: str, **limits: int) -> tuple[str, str]:
    """(key id, plain key)."""
    client = redis_connect(redis)
    try:
        record, plain = await KeyStore(client, redis.prefix).create(tenant, "t", Limits(**limits))
        return record.id, plain
    finally:
        await client.aclose()


async def revoke(redis: RedisSettings, key_id: str) -> None:
    client = redis_connect(redis)
    try:
        assert await KeyStore(client, redis.prefix).revoke(key_id)
    finally:
        await client.aclose()


@dataclass
class AuthStack:
    asr: ServerThread
    tts: ServerThread
    gateway: ServerThread
    gateway_app: Any
    redis: RedisSettings
    key: str
    key_id: str

    def url(self, path: str) -> str:
        server = {"asr": self.asr, "tts": self.tts}.get(SERVICE_OF.get(path, ""), self.gateway)
        return f"{server.ws if path in WS_PATHS else server.http}{path}"

    async def jobs_queued(self) -> int:
        keys, client = Keys(self.redis.prefix), redis_connect(self.redis)
        try:
            names = [keys.jobs("asr"), keys.jobs("asr", "partial"), keys.jobs("tts")]
            return sum([await client.xlen(name) for name in names])
        finally:
            await client.aclose()


WS_PATHS = ("/v1/stream", "/v1/stream/asr", "/v1/stream/tts")
SERVICE_OF = {
    "/v1/stream/asr": "asr",
    "/v1/audio/transcriptions": "asr",
    "/v1/stream/tts": "tts",
    "/v1/audio/speech": "tts",
    "/v1/voices": "tts",
    "/v1/voices/v_0123456789abcdef": "tts",
}


@contextmanager
def start_auth_stack(
    redis: RedisSettings, voices: Path, settings: AuthSettings = AUTH
) -> Iterator[AuthStack]:
    """ASR, TTS and a gateway that lists the TTS service's voices (`GET /v1/voices`)."""
    common: dict[str, Any] = {"profile": "fake", "redis": redis, "auth": settings}
    key_id, key = asyncio.run(new_key(redis, "acme"))
    library = TtsSection(voices=VoiceLibrarySettings(dir=voices))
    tts_server = ServerThread(tts_app(TtsSettings(**common, tts=library)))
    gw = gateway_app(GatewaySettings(**common, gateway=GatewaySection(tts_url=tts_server.http)))
    with (
        ServerThread(asr_app(AsrSettings(**common))) as asr,
        tts_server as tts,
        ServerThread(gw) as gateway,
    ):
        yield AuthStack(asr, tts, gateway, gw, redis, key, key_id)


@pytest.fixture(scope="module")
def stack(redis_server: RedisProc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthStack]:
    with start_auth_stack(redis_server.settings(), tmp_path_factory.mktemp("voices")) as started:
        yield started


def bearer(credential: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}"}


async def rest(stack: AuthStack, path: str, headers: dict[str, str]) -> httpx.Response:
    """One request to a REST entry point, with a body it would otherwise accept."""
    url = stack.url(path)
    async with httpx.AsyncClient(timeout=30) as http:
        if path == "/v1/audio/transcriptions":
            audio = encode_audio(np.zeros(16000, np.float32), 16000, "wav")
            files = {"file": ("a.wav", audio, "audio/wav")}
            return await http.post(url, headers=headers, files=files, data={"model": "whisper-1"})
        if path == "/v1/audio/speech":
            body = {"model": "tts-1", "input": "hello", "voice": "default"}
            return await http.post(url, headers=headers, json=body)
        if path == "/v1/sessions":
            return await http.post(url, headers=headers, json={})
        if path.startswith("/v1/voices/"):
            return await http.delete(url, headers=headers)
        return await http.get(url, headers=headers)


async def refused_handshake(url: str, **kwargs: Any) -> tuple[int, dict[str, Any]]:
    """The HTTP status and JSON body a refused WebSocket upgrade got."""
    with pytest.raises(InvalidStatus) as refused:
        async with connect(url, open_timeout=10, **kwargs):
            pass
    response = refused.value.response
    return response.status_code, json.loads(response.body or b"{}")


@asynccontextmanager
async def session(url: str, **kwargs: Any) -> AsyncIterator[tuple[ClientConnection, Any]]:
    async with connect(url, open_timeout=10, **kwargs) as ws:
        yield ws, json.loads(await asyncio.wait_for(ws.recv(), 10))


REST_PATHS = (
    "/v1/audio/transcriptions",
    "/v1/audio/speech",
    "/v1/voices",
    "/v1/voices/v_0123456789abcdef",
    "/v1/sessions",
    "/metrics",
)


async def bad_credentials(stack: AuthStack) -> dict[str, dict[str, str] | None]:
    """Each kind of bad credential, as the headers that carry it (None: no credential)."""
    revoked_id, revoked_key = await new_key(stack.redis, "acme")
    expired, _ = sign_token(SECRET.encode(), "acme", stack.key_id, -5, {})
    revoked_token, _ = sign_token(SECRET.encode(), "acme", revoked_id, 60, {})
    forged, _ = sign_token(b"another-secret-" + b"x" * 32, "acme", stack.key_id, 60, {})
    other_tenant, _ = sign_token(SECRET.encode(), "evil", stack.key_id, 60, {})
    await revoke(stack.redis, revoked_id)
    wrong = stack.key[:-8] + "AAAAAAAA"
    return {
        "none": None,
        "wrong key": bearer(wrong),
        "not bearer": {"Authorization": f"Basic {stack.key}"},
        "garbage": bearer("not-a-key-or-token"),
        "expired token": bearer(expired),
        "revoked key": bearer(revoked_key),
        "token of a revoked key": bearer(revoked_token),
        "forged token": bearer(forged),
        "token naming another tenant": bearer(other_tenant),
    }


async def test_every_entry_point_refuses_bad_credentials_before_any_work(
    stack: AuthStack,
) -> None:
    cases = await bad_credentials(stack)
    queued = await stack.jobs_queued()
    for name, headers in cases.items():
        for path in WS_PATHS:
            status, body = await refused_handshake(stack.url(path), additional_headers=headers)
            assert (status, body["error"]["code"]) == (401, "unauthorized"), (name, path)
        for path in REST_PATHS:
            response = await rest(stack, path, headers or {})
            assert response.status_code == 401, (name, path, response.text)
            assert response.json()["error"]["code"] == "unauthorized"
            if headers:
                assert headers["Authorization"].split()[-1] not in response.text
    assert await stack.jobs_queued() == queued  # nothing reached the bus
    assert stack.gateway_app.state.sessions == {}


async def test_health_stays_open_and_brief_without_a_credential(stack: AuthStack) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        for server in (stack.asr, stack.tts, stack.gateway):
            brief = (await http.get(f"{server.http}/health")).json()
            assert brief.keys() == {"status", "service"}
            assert (await http.get(f"{server.http}/ready")).status_code == 200
            full = (await http.get(f"{server.http}/health", headers=bearer(stack.key))).json()
            assert "uptime_s" in full
            metrics = await http.get(f"{server.http}/metrics", headers=bearer(stack.key))
            assert metrics.status_code == 200 and "va_auth_refused_total" in metrics.text


async def test_a_key_opens_every_entry_point(stack: AuthStack) -> None:
    for path in WS_PATHS:
        async with session(stack.url(path), additional_headers=bearer(stack.key)) as (_, first):
            assert first["type"] in ("session.created", "ready")
    for path in ("/v1/audio/transcriptions", "/v1/audio/speech", "/v1/voices"):
        response = await rest(stack, path, bearer(stack.key))
        assert response.status_code == 200, (path, response.text)


async def test_a_client_token_by_subprotocol_or_query_and_its_settings(stack: AuthStack) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        asked = {"expires_in": 120, "session": {"voice": "alba", "instructions": "Be brief."}}
        url = f"{stack.gateway.http}/v1/sessions"
        issued = (await http.post(url, json=asked, headers=bearer(stack.key))).json()
        token = issued["token"]
        assert issued["tenant"] == "acme"
        again = await http.post(url, json={}, headers=bearer(token))
        assert again.status_code == 403 and again.json()["error"]["code"] == "forbidden"
        too_long = await http.post(url, json={"expires_in": 7201}, headers=bearer(stack.key))
        assert too_long.status_code == 400
    protocols = [auth.APP_SUBPROTOCOL, auth.TOKEN_SUBPROTOCOL + token]
    async with session(stack.url("/v1/stream"), subprotocols=protocols) as (ws, created):  # type: ignore[arg-type]
        assert ws.subprotocol == auth.APP_SUBPROTOCOL  # never the token
        assert created["session"]["voice"] == "alba"
        assert created["session"]["instructions"] == "Be brief."
    async with session(f"{stack.url('/v1/stream/tts')}?access_token={token}") as (_, ready):
        assert ready["type"] == "ready"


async def test_a_client_token_chooses_the_agent_of_a_realtime_session(stack: AuthStack) -> None:
    """What docs/realtime.md tells Realtime clients to do: their own session.update cannot
    name an agent, a client token can. Here it names `openai`, whose LLM is not running:
    the turn fails with `agent_failed` where the default `echo` would have answered."""
    async with httpx.AsyncClient(timeout=10) as http:
        url = f"{stack.gateway.http}/v1/sessions"
        asked = {"session": {"agent": "openai"}}
        token = (await http.post(url, json=asked, headers=bearer(stack.key))).json()["token"]
    realtime = f"{stack.gateway.ws}/v1/realtime"
    async with connect(realtime, additional_headers=bearer(token), open_timeout=10) as ws:
        content = [{"type": "input_text", "text": "hello"}]
        item = {"type": "message", "role": "user", "content": content}
        await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
        await ws.send(json.dumps({"type": "response.create"}))
        while (event := json.loads(await asyncio.wait_for(ws.recv(), 20)))["type"] != "error":
            assert event["type"] != "response.output_audio.delta", "the echo agent answered"
        assert event["error"]["code"] == "agent_failed"


async def test_the_origin_allow_list(stack: AuthStack) -> None:
    url = stack.url("/v1/stream")
    key = bearer(stack.key)
    status, body = await refused_handshake(
        url, additional_headers=key, origin="https://evil.example"
    )
    assert (status, body["error"]["code"]) == (403, "forbidden")
    async with session(url, additional_headers=key, origin=ORIGIN) as (_, created):  # type: ignore[arg-type]
        assert created["type"] == "session.created"
    same_site = f"http://127.0.0.1:{stack.gateway.port}"
    async with session(url, additional_headers=key, origin=same_site) as (_, created):  # type: ignore[arg-type]
        assert created["type"] == "session.created"
    async with httpx.AsyncClient(timeout=10) as http:
        preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST"}
        allowed = await http.options(f"{stack.gateway.http}/v1/sessions", headers=preflight)
        assert allowed.headers["access-control-allow-origin"] == ORIGIN
        preflight["Origin"] = "https://evil.example"
        other = await http.options(f"{stack.gateway.http}/v1/sessions", headers=preflight)
        assert "access-control-allow-origin" not in other.headers


async def test_another_tenants_session_cannot_be_resumed(stack: AuthStack) -> None:
    _, other_key = await new_key(stack.redis, "globex")
    url = stack.url("/v1/stream")
    async with session(url, additional_headers=bearer(stack.key)) as (ws, created):
        session_id = created["session"]["id"]
        await ws.send(json.dumps({"type": "session.close"}))
        await asyncio.wait_for(ws.wait_closed(), 10)
    await wait_for(lambda: stack.gateway_app.state.sessions == {})
    queued = await stack.jobs_queued()
    status, body = await refused_handshake(
        f"{url}?session_id={session_id}", additional_headers=bearer(other_key)
    )
    assert (status, body["error"]["code"]) == (403, "forbidden")
    assert session_id not in body["error"]["message"]
    assert await stack.jobs_queued() == queued
    own = f"{url}?session_id={session_id}"
    async with session(own, additional_headers=bearer(stack.key)) as (_, resumed):
        assert resumed["session"]["id"] == session_id and resumed["session"]["resumed"]


async def test_jobs_carry_the_tenant(stack: AuthStack) -> None:
    async with session(stack.url("/v1/stream"), additional_headers=bearer(stack.key)) as (ws, _):
        await ws.send(json.dumps({"type": "response.create", "text": "hello there"}))
        await recv_until(ws, "response.done", timeout_s=20)
    client = redis_connect(stack.redis)
    try:
        entries = await client.xrange(Keys(stack.redis.prefix).jobs("tts"))
    finally:
        await client.aclose()
    tenants = {json.loads(fields[b"meta"])["tenant"] for _, fields in entries}
    assert tenants == {"acme"}


async def wait_for(condition: Any, timeout_s: float = 10.0) -> None:
    """Until `condition()` holds (state another thread or process changes)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.02)


async def test_the_daily_audio_quota(stack: AuthStack, one_utc_day: None) -> None:
    _, key = await new_key(stack.redis, "smallco", audio_seconds_per_day=2)
    url = stack.url("/v1/stream")
    second = np.zeros(16000, np.int16).tobytes()
    async with session(url, additional_headers=bearer(key)) as (ws, _):
        for _ in range(4):
            for i in range(0, len(second), 640):
                await ws.send(second[i : i + 640])
        events = []
        with pytest.raises(websockets.ConnectionClosed):
            while True:
                message = await asyncio.wait_for(ws.recv(), 10)
                if isinstance(message, str):
                    events.append(json.loads(message))
        errors = [e for e in events if e.get("type") == "error"]
        assert errors[-1]["code"] == "quota_exceeded" and errors[-1]["fatal"]
        assert ws.close_code == 1008 and "quota" in (ws.close_reason or "")
    status, body = await refused_handshake(url, additional_headers=bearer(key))
    assert (status, body["error"]["code"]) == (429, "quota_exceeded")
    response = await rest(stack, "/v1/audio/transcriptions", bearer(key))
    assert response.status_code == 429 and int(response.headers["Retry-After"]) >= 1


async def test_the_gateways_voice_list_is_the_callers_tenants(stack: AuthStack) -> None:
    """The browser page lists voices from the gateway, which asks the TTS service on the
    caller's behalf: with the caller's credential, so it gets the caller's tenant's voices."""
    _, globex = await new_key(stack.redis, "globex")
    relay = f"{stack.gateway.http}/v1/voices"
    async with httpx.AsyncClient(timeout=30) as http:
        files = {"file": ("clip.wav", GOOD, "audio/wav")}
        made = await http.post(
            f"{stack.tts.http}/v1/voices", files=files, data={"name": "Ada"}, headers=bearer(globex)
        )
        assert made.status_code == 201, made.text
        voice = made.json()["id"]
        token = (
            await http.post(f"{stack.gateway.http}/v1/sessions", json={}, headers=bearer(globex))
        ).json()["token"]
        for credential in (globex, token):  # a server's key, the page's client token
            listed = await http.get(relay, headers=bearer(credential))
            assert listed.status_code == 200, listed.text
            assert voice in {v["id"] for v in listed.json()["voices"]}
        other = await http.get(relay, headers=bearer(stack.key))  # acme
        assert other.status_code == 200, other.text
        assert voice not in {v["id"] for v in other.json()["voices"]}
        assert listed.json()["default"] == other.json()["default"]
        refused = await http.get(relay)
        assert refused.status_code == 401  # the gateway's own door, before any relay
        await http.delete(f"{stack.tts.http}/v1/voices/{voice}", headers=bearer(globex))


async def test_the_python_client_sends_its_key(stack: AuthStack) -> None:
    async with StreamClient(stack.url("/v1/stream"), api_key=stack.key) as client:
        assert client.session["id"].startswith("sess")
    with pytest.raises(InvalidStatus):
        async with StreamClient(stack.url("/v1/stream")):
            pass


def test_the_openai_sdk_authenticates_with_a_key(stack: AuthStack) -> None:
    tts = OpenAI(base_url=f"{stack.tts.http}/v1", api_key=stack.key, max_retries=0)
    speech = tts.audio.speech.create(model="tts-1", voice="alloy", input="hello there")
    assert len(speech.content) > 1000
    refused = OpenAI(base_url=f"{stack.tts.http}/v1", api_key="sk-not-ours", max_retries=0)
    with pytest.raises(AuthenticationError):
        refused.audio.speech.create(model="tts-1", voice="alloy", input="hello there")


async def test_the_asr_stream_closes_when_the_quota_runs_out(
    stack: AuthStack, one_utc_day: None
) -> None:
    _, key = await new_key(stack.redis, "tinyco", audio_seconds_per_day=1)
    frame = np.zeros(320, np.int16).tobytes()  # 20 ms
    async with session(stack.url("/v1/stream/asr"), additional_headers=bearer(key)) as (ws, _):
        with pytest.raises(websockets.ConnectionClosed):
            for _ in range(200):  # 4 s
                await ws.send(frame)
            while True:
                await asyncio.wait_for(ws.recv(), 10)
        assert ws.close_code == 1008 and "quota" in (ws.close_reason or "")
