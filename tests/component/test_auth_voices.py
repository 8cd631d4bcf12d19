"""The voice library is per tenant: a tenant lists, speaks with and deletes only its own
voices; another tenant's voice id is unknown to it (404 / 400), as if it did not exist."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from services.common.auth.api_keys import KeyStore
from services.common.auth.settings import AuthSettings
from services.common.bus.connection import connect
from services.common.bus.settings import RedisSettings
from services.tts.app import create_app
from services.tts.settings import TtsSection, TtsSettings, VoiceLibrarySettings
from tests.component.test_voice_library import GOOD, SpyEspeak, library, speech, upload
from tests.conftest import RedisProc

AUTH = AuthSettings(required=True, token_secret=SecretStr("voices-test-secret-" + "v" * 32))


def make_keys(redis: RedisSettings, *tenants: str) -> list[str]:
    async def create() -> list[str]:
        client = connect(redis)
        try:
            store = KeyStore(client, redis.prefix)
            return [(await store.create(tenant, "t"))[1] for tenant in tenants]
        finally:
            await client.aclose()

    return asyncio.run(create())


class Tenant:
    """One TestClient (one event loop for the app), speaking as one tenant at a time."""

    def __init__(self, client: TestClient, key: str) -> None:
        self.client, self.key = client, key

    def __enter__(self) -> TestClient:
        self.client.headers["Authorization"] = f"Bearer {self.key}"
        return self.client

    def __exit__(self, *_: object) -> None:
        del self.client.headers["Authorization"]


@pytest.fixture
def clients(redis_server: RedisProc, tmp_path: Path) -> Iterator[tuple[Tenant, Tenant]]:
    redis = redis_server.settings()
    acme, globex = make_keys(redis, "acme", "globex")
    section = TtsSection(voices=VoiceLibrarySettings(dir=tmp_path / "voices"))
    app = create_app(TtsSettings(redis=redis, tts=section, auth=AUTH), SpyEspeak())
    with TestClient(app) as client:
        yield Tenant(client, acme), Tenant(client, globex)


def test_each_tenant_sees_uses_and_deletes_only_its_own_voices(
    clients: tuple[Tenant, Tenant],
) -> None:
    acme, globex = clients
    with acme as client:
        made = upload(client, GOOD, name="Ada")
        assert made.status_code == 201, made.text
        voice = made.json()["id"]
        assert [v["id"] for v in library(client)] == [voice]
        assert speech(client, voice).status_code == 200
    with globex as client:
        assert library(client) == []
        refused = speech(client, voice)
        assert refused.status_code == 400
        assert refused.json()["error"]["code"] == "invalid_message"
        assert client.delete(f"/v1/voices/{voice}").status_code == 404
    with acme as client:
        assert [v["id"] for v in library(client)] == [voice]  # still there
        assert client.delete(f"/v1/voices/{voice}").status_code == 200
        assert library(client) == []
    assert acme.client.get("/v1/voices").status_code == 401  # no credential


def test_the_tts_stream_refuses_another_tenants_voice(
    clients: tuple[Tenant, Tenant],
) -> None:
    acme, globex = clients
    with acme as client:
        voice = upload(client, GOOD).json()["id"]
    with globex as client, client.websocket_connect("/v1/stream/tts") as ws:
        assert ws.receive_json()["type"] == "ready"
        ws.send_json({"type": "speak", "id": "r1", "text": "hello", "voice": voice})
        error = ws.receive_json()
    assert (error["type"], error["id"], error["code"]) == ("error", "r1", "invalid_message")
