"""Secrets never leak: one run that makes a key with the CLI, asks for a client token, uses
both (header, subprotocol, query) and fails with bad ones, with every logger at DEBUG;
then every log line, every /health and /metrics and `voice-agent config` and `keys list`
output is searched for each test secret: 0 hits."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from services.asr.app import create_app as asr_app
from services.asr.settings import AsrSettings
from services.common.auth.credentials import APP_SUBPROTOCOL, TOKEN_SUBPROTOCOL, sign_token
from services.common.auth.settings import AuthSettings
from services.gateway.app import create_app as gateway_app
from services.gateway.llm import LlmSettings
from services.gateway.settings import GatewaySettings
from services.ops.cli import main
from services.tts.app import create_app as tts_app
from services.tts.settings import TtsSettings
from tests.conftest import RedisProc
from tests.servers import ServerThread

TOKEN_SECRET = "grep-test-token-secret-" + "T0k" * 12
LLM_KEY = "sk-grep-test-llm-key-" + "L1m" * 10
LOUD = ("", "uvicorn", "uvicorn.error", "websockets", "services", "httpx")


def test_no_secret_in_logs_health_metrics_or_config(
    redis_server: RedisProc,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    redis = redis_server.settings()
    monkeypatch.setenv("VA_REDIS__URL", redis.url)
    monkeypatch.setenv("VA_REDIS__PREFIX", redis.prefix)
    main(["keys", "create", "--tenant", "acme", "--name", "grep"])
    key = capfd.readouterr().out.strip()
    assert key.startswith("va_")
    auth = AuthSettings(required=True, token_secret=SecretStr(TOKEN_SECRET), protect_ops=True)
    llm = LlmSettings(api_key=SecretStr(LLM_KEY))
    common: dict[str, Any] = {"profile": "fake", "redis": redis, "auth": auth}
    seen: list[str] = []
    with (
        ServerThread(asr_app(AsrSettings(**common))) as asr,
        ServerThread(tts_app(TtsSettings(**common))) as tts,
        ServerThread(gateway_app(GatewaySettings(**common, llm=llm))) as gateway,
    ):
        for name in LOUD:
            caplog.set_level(logging.DEBUG, logger=name)
        monkeypatch.setattr(logging.getLogger("uvicorn"), "propagate", True)
        secrets = _use_and_misuse(gateway, tts, key)
        for server in (asr, tts, gateway):
            for path in ("/health", "/metrics"):
                reply = httpx.get(
                    f"{server.http}{path}", headers={"Authorization": f"Bearer {key}"}
                )
                assert reply.status_code == 200
                seen.append(reply.text)
    monkeypatch.setenv("VA_AUTH__TOKEN_SECRET", TOKEN_SECRET)
    monkeypatch.setenv("VA_LLM__API_KEY", LLM_KEY)
    main(["config", "--markdown"])
    main(["keys", "list"])
    main(["keys", "list", "--json"])
    out, err = capfd.readouterr()
    seen += [out, err, caplog.text, *(r.getMessage() for r in caplog.records)]
    everything = "\n".join(seen)
    secrets += [key, key.split("_", 2)[2], TOKEN_SECRET, LLM_KEY]
    for secret in secrets:
        assert secret not in everything, f"a secret leaked: {secret[:6]}..."
    assert "[redacted]" in caplog.text  # the token sent in a URL was logged, redacted
    assert "WebSocket /v1/stream" in caplog.text  # uvicorn's handshake lines were captured


def _use_and_misuse(gateway: ServerThread, tts: ServerThread, key: str) -> list[str]:
    """Use the key and a token every way, fail with bad ones; the secrets involved."""
    asked = httpx.post(
        f"{gateway.http}/v1/sessions", json={}, headers={"Authorization": f"Bearer {key}"}
    )
    token = asked.json()["token"]
    stream = f"{gateway.ws}/v1/stream"
    with connect(stream, subprotocols=[APP_SUBPROTOCOL, TOKEN_SUBPROTOCOL + token]) as ws:  # type: ignore[list-item]
        assert json.loads(ws.recv())["type"] == "session.created"
        ws.send(json.dumps({"type": "response.create", "text": "hello"}))
        while not (isinstance(m := ws.recv(), str) and json.loads(m)["type"] == "response.done"):
            pass
    with connect(f"{gateway.ws}/v1/stream?access_token={token}") as ws:
        assert json.loads(ws.recv())["type"] == "session.created"
    with connect(f"{tts.ws}/v1/stream/tts", additional_headers={"Authorization": f"Bearer {key}"}):
        pass
    wrong = key[:-6] + "zzzzzz"
    expired = sign_token(TOKEN_SECRET.encode(), "acme", key.split("_")[1], -1, {})[0]
    for bad in (wrong, expired):
        for attempt in (
            {"additional_headers": {"Authorization": f"Bearer {bad}"}},
            {"subprotocols": [APP_SUBPROTOCOL, TOKEN_SUBPROTOCOL + bad]},
        ):
            with pytest.raises(InvalidStatus) as refused:
                connect(stream, **attempt).close()
            assert bad not in refused.value.response.body.decode()
        with pytest.raises(InvalidStatus):
            connect(f"{stream}?access_token={bad}").close()
        reply = httpx.post(
            f"{gateway.http}/v1/sessions", json={}, headers={"Authorization": f"Bearer {bad}"}
        )
        assert reply.status_code == 401 and bad not in reply.text
    return [token, wrong, expired]
