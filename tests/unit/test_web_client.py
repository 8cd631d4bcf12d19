"""The gateway's browser page and voice list, in process (no lifespan: nothing loads)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from services.gateway.app import create_app
from services.gateway.settings import GatewaySection, GatewaySettings


def _client(**section: object) -> TestClient:
    return TestClient(create_app(GatewaySettings(gateway=GatewaySection(**section))))  # type: ignore[arg-type]


def test_the_page_and_its_files_are_served_with_a_strict_csp() -> None:
    client = _client(tts_url=None)
    page = client.get("/")
    assert page.status_code == 200 and "/static/app.js" in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    for name in ("app.js", "worklet.js", "style.css"):
        assert client.get(f"/static/{name}").status_code == 200, name
    assert client.get("/static/nope.js").status_code == 404


def test_voices_without_a_tts_service_is_an_openai_shaped_503() -> None:
    response = _client(tts_url=None).get("/v1/voices")
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "tts_unavailable"
    unreachable = _client(tts_url="http://127.0.0.1:9").get("/v1/voices")
    assert unreachable.status_code == 503


def test_the_page_can_be_turned_off() -> None:
    assert _client(web_client=False).get("/").status_code == 404


def test_with_auth_on_the_page_loads_and_everything_else_needs_a_credential() -> None:
    """The page asks for its token, so it must load without one; nothing it talks to may."""
    from redis.asyncio import Redis

    from services.common.auth.guard import AuthGuard
    from services.common.auth.settings import AuthSettings

    redis = Redis.from_url("redis://127.0.0.1:1/0")  # never reached: no request is made
    guard = AuthGuard(None, AuthSettings(required=True), redis, "va", "gateway")  # type: ignore[arg-type]
    http = {"type": "http", "client": ("203.0.113.9", 5000)}
    for path in ("/", "/static/app.js", "/static/worklet.js"):
        assert guard._open(path, {**http, "path": path}), path
    for path in ("/v1/voices", "/v1/sessions", "/static", "/admin/drain"):
        assert not guard._open(path, {**http, "path": path}), path
    assert not guard._open("/", {**http, "type": "websocket", "path": "/"})


def test_voices_passes_on_the_tts_services_answer_about_the_caller() -> None:
    """A 401/403/429 from the TTS service is about the caller (its credential, its
    limits): the caller gets it as it is, not a 503 that blames the service."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    from tests.servers import ServerThread

    tts = FastAPI()

    @tts.get("/v1/voices")
    async def limited() -> JSONResponse:
        body = {"error": {"message": "slow down", "type": "rate_limited", "code": "rate_limited"}}
        return JSONResponse(body, 429, headers={"Retry-After": "7"})

    with ServerThread(tts) as server:
        response = _client(tts_url=server.http).get("/v1/voices")
    assert response.status_code == 429
    assert response.headers["retry-after"] == "7"
    assert response.json()["error"]["code"] == "rate_limited"
