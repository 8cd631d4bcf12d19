"""`va_requests_total{service="tts",route="speech"}` counts each request once, also one
whose client hangs up mid-stream: `cancelled`, as the ASR service counts a hang-up (it used
to be counted under no outcome at all). The engine holds its second piece until the test
lets it, so the client hangs up with the stream open."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client import REGISTRY

from services.tts.app import create_app
from services.tts.settings import TtsSection, TtsSettings
from tests.conftest import RedisProc
from tests.e2e.test_openai_speech_stream import TEXT, GatedEngine
from tests.servers import ServerThread

OUTCOMES = ("ok", "error", "cancelled")
TIMEOUT_S = 20.0
"""Only turns a hang (the bug) into a failure."""


def _counts() -> dict[str, float]:
    labels = {"service": "tts", "route": "speech"}
    return {
        outcome: REGISTRY.get_sample_value("va_requests_total", {**labels, "outcome": outcome})
        or 0.0
        for outcome in OUTCOMES
    }


def _changes(before: dict[str, float]) -> dict[str, float]:
    now = _counts()
    return {k: now[k] - before[k] for k in OUTCOMES if now[k] != before[k]}


@pytest.fixture
def served(redis_server: RedisProc) -> Iterator[tuple[str, GatedEngine]]:
    engine = GatedEngine()
    settings = TtsSettings(
        profile="fake", redis=redis_server.settings(), tts=TtsSection(engine="fake")
    )
    try:
        with ServerThread(create_app(settings, engine)) as server:
            yield server.http, engine
    finally:
        engine.gate.set()


@pytest.mark.parametrize("stream_format", ["audio", "sse"])
def test_a_client_that_hangs_up_mid_stream_is_counted_cancelled(
    served: tuple[str, GatedEngine], stream_format: str
) -> None:
    url, engine = served
    body = {"model": "tts-1", "voice": "alloy", "input": TEXT, "response_format": "pcm"}
    before = _counts()
    engine.gate.clear()
    with (
        httpx.Client(timeout=TIMEOUT_S) as http,
        http.stream(
            "POST", f"{url}/v1/audio/speech", json={**body, "stream_format": stream_format}
        ) as response,
    ):
        assert response.status_code == 200
        assert next(response.iter_raw())  # the first piece; the engine holds the second
    # the client has hung up (its connection closed with the body unread)
    deadline = time.monotonic() + TIMEOUT_S
    while _changes(before) != {"cancelled": 1} and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _changes(before) == {"cancelled": 1}
    engine.gate.set()  # the engine's piece ends; nothing more is counted for that request
    whole = httpx.post(f"{url}/v1/audio/speech", json=body, timeout=TIMEOUT_S)
    assert whole.status_code == 200 and whole.content
    assert _changes(before) == {"cancelled": 1, "ok": 1}
