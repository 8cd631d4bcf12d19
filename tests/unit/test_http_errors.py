"""Every HTTP error of a service is JSON in OpenAI's error shape, even the unplanned ones."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient

from services.common.bus.settings import RedisSettings
from services.common.errors import CapacityError
from tests.ops_app import ops_app


def _app() -> FastAPI:
    app = ops_app("tts", RedisSettings())

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("secret detail")

    @app.get("/busy")
    async def busy() -> None:
        raise CapacityError("full", retry_after_s=2.4)

    return app


def test_an_unexpected_exception_is_a_json_500_without_its_details() -> None:
    with TestClient(_app(), raise_server_exceptions=False) as client:
        response = client.get("/boom")
    assert response.status_code == 500
    assert response.json() == {
        "error": {
            "message": "internal error (RuntimeError)",
            "type": "internal",
            "code": "internal",
        }
    }


def test_starlettes_own_refusals_and_domain_errors_keep_their_status() -> None:
    with TestClient(_app()) as client:
        missing, wrong = client.get("/nope"), client.delete("/boom")
        busy = client.get("/busy")
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "invalid_message")
    assert (wrong.status_code, wrong.headers["allow"]) == (405, "GET")
    assert (busy.status_code, busy.headers["retry-after"]) == (503, "2")
    assert busy.json()["error"] == {"message": "full", "type": "capacity", "code": "capacity"}
