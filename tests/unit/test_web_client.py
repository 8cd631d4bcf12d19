"""The gateway's browser page and voice list, in process (no lifespan: nothing loads)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from services.gateway.app import create_app
from services.gateway.settings import GatewaySection, GatewaySettings


def _client(**section: object) -> TestClient:
    return TestClient(create_app(GatewaySettings(gateway=GatewaySection(**section))))  # type: ignore[arg-type]


PAGE_FILES = (
    "/",
    "/static/index.html",
    "/static/app.js",
    "/static/worklet.js",
    "/static/style.css",
)


def test_the_page_and_its_files_are_served_with_a_strict_csp() -> None:
    """Every file of the page, under any name, gets the same headers: a CSP that lets it
    talk only to its own origin and be framed by no one (another site framing it with
    allow=microphone would drive the user's agent), no sniffing, no referrer."""
    client = _client(tts_url=None)
    page = client.get("/")
    assert page.status_code == 200 and "/static/app.js" in page.text
    for path in PAGE_FILES:
        response = client.get(path)
        assert response.status_code == 200, path
        csp = response.headers.get("content-security-policy", "")
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp, (path, csp)
        connect = next(d for d in csp.split(";") if d.strip().startswith("connect-src"))
        assert connect.split() == ["connect-src", "'self'"], (path, csp)  # not any ws: host
        assert response.headers.get("x-frame-options") == "DENY", path
        assert response.headers.get("x-content-type-options") == "nosniff", path
        assert response.headers.get("referrer-policy") == "no-referrer", path
    assert client.get("/static/nope.js").status_code == 404


def test_the_page_and_its_files_are_revalidated_on_every_load() -> None:
    """A gateway upgraded under an open tab must not leave it running a cached app.js
    against a new protocol: every file is revalidated (no-cache), cheaply (a 304 for an
    unchanged ETag)."""
    client = _client(tts_url=None)
    for path in PAGE_FILES:
        response = client.get(path)
        assert response.headers.get("cache-control") == "no-cache", path
    etag = client.get("/static/app.js").headers["etag"]
    again = client.get("/static/app.js", headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.headers.get("cache-control") == "no-cache"


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
