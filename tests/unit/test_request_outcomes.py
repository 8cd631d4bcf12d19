"""`va_requests_total` counts each REST request once, with its outcome: `ok` where it is
served, `error` for whatever error it gets back (a bad upload, a refused field, a stream that
breaks after its first audio); `cancelled` where the client hung up first
(tests/e2e/test_asr_faults.py). The error-rate alert divides the errors by it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY

from services.asr.app import create_app as asr_app
from services.asr.settings import AsrSettings
from services.common.audio.pcm import encode_audio
from services.tts.app import create_app as tts_app
from services.tts.engines.base import AudioF32, SpeechRequest
from services.tts.engines.fake import FakeTtsEngine
from services.tts.settings import FakeTtsSettings, TtsSettings
from tests.conftest import RedisProc


def count(service: str, route: str, outcome: str) -> float:
    labels = {"service": service, "route": route, "outcome": outcome}
    return REGISTRY.get_sample_value("va_requests_total", labels) or 0.0


class Counted:
    """The change of every (route, outcome) count of a service across a block."""

    def __init__(self, service: str, routes: tuple[str, ...]) -> None:
        self.keys = [(route, outcome) for route in routes for outcome in ("ok", "error")]
        self.service = service
        self.before = {key: count(service, *key) for key in self.keys}

    def changes(self) -> dict[tuple[str, str], float]:
        now = {key: count(self.service, *key) - self.before[key] for key in self.keys}
        return {key: n for key, n in now.items() if n}


class BreaksMidStream(FakeTtsEngine):
    """The fake tone, failing after its first chunk when the text says so."""

    def synthesize(self, request: SpeechRequest) -> Iterator[AudioF32]:
        chunks = super().synthesize(request)
        if "break" not in request.text:
            return chunks
        return self._breaking(chunks)

    @staticmethod
    def _breaking(chunks: Iterator[AudioF32]) -> Iterator[AudioF32]:
        yield next(chunks)
        raise RuntimeError("the engine fell over")


@pytest.fixture
def asr(redis_server: RedisProc) -> Iterator[TestClient]:
    with TestClient(asr_app(AsrSettings(profile="fake", redis=redis_server.settings()))) as client:
        yield client


@pytest.fixture
def tts(redis_server: RedisProc) -> Iterator[TestClient]:
    settings = TtsSettings(profile="fake", redis=redis_server.settings())
    app = tts_app(settings, BreaksMidStream(FakeTtsSettings()))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def wav() -> bytes:
    tone = 0.3 * np.sin(2 * np.pi * 220 * np.arange(16000) / 16000)
    return encode_audio(tone.astype(np.float32), 16000, "wav")


def test_asr_requests_are_counted_with_their_outcome(asr: TestClient) -> None:
    counted = Counted("asr", ("transcriptions", "translations"))
    form: dict[str, Any] = {"model": "whisper-1"}
    good = asr.post("/v1/audio/transcriptions", files={"file": ("a.wav", wav())}, data=form)
    assert good.status_code == 200, good.text
    junk = {"file": ("a.wav", b"not audio at all" * 10)}
    assert asr.post("/v1/audio/transcriptions", files=junk, data=form).status_code == 400
    assert asr.post("/v1/audio/translations", files=junk, data=form).status_code == 400
    assert asr.post("/v1/audio/transcriptions", data=form).status_code == 400  # no file
    assert asr.get("/v1/models/nonexistent").status_code == 404  # not a counted route
    assert counted.changes() == {
        ("transcriptions", "ok"): 1,
        ("transcriptions", "error"): 2,
        ("translations", "error"): 1,
    }


def test_tts_requests_are_counted_once_with_their_outcome(tts: TestClient) -> None:
    counted = Counted("tts", ("speech",))
    body = {"model": "tts-1", "voice": "alloy", "response_format": "wav"}
    good = tts.post("/v1/audio/speech", json={**body, "input": "hello there"})
    assert good.status_code == 200 and len(good.content) > 1000
    bad = tts.post("/v1/audio/speech", json={**body, "input": "hi", "response_format": "xyz"})
    assert bad.status_code == 400
    assert tts.post("/v1/audio/speech", json={"model": "tts-1"}).status_code == 400  # no input
    assert counted.changes() == {("speech", "ok"): 1, ("speech", "error"): 2}

    counted = Counted("tts", ("speech",))
    broken = tts.post("/v1/audio/speech", json={**body, "input": "break it now please"})
    assert broken.status_code == 200  # the audio had started: the stream is cut short
    assert counted.changes() == {("speech", "error"): 1}


def test_an_upload_refused_for_its_declared_size_is_counted(redis_server: RedisProc) -> None:
    """The body limit answers before the body is read; that 413 is an error reply like any
    other (it was written around the app's error handling, and counted nowhere)."""
    settings = AsrSettings(profile="fake", redis=redis_server.settings())
    settings.asr.max_upload_mb = 0.1
    with TestClient(asr_app(settings)) as asr:
        counted = Counted("asr", ("transcriptions",))
        errors = REGISTRY.get_sample_value(
            "va_errors_total", {"service": "asr", "code": "invalid_audio"}
        )
        big = {"file": ("a.wav", bytes(400_000))}
        refused = asr.post("/v1/audio/transcriptions", files=big, data={"model": "whisper-1"})
        assert refused.status_code == 413 and refused.json()["error"]["code"] == "invalid_audio"
        assert counted.changes() == {("transcriptions", "error"): 1}
        after = REGISTRY.get_sample_value(
            "va_errors_total", {"service": "asr", "code": "invalid_audio"}
        )
        assert (after or 0) - (errors or 0) == 1
