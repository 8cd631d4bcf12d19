"""Per-request speaking style (exaggeration, cfg_weight, temperature) reaches the engine
from every door: the TTS WebSocket, the REST endpoint and Redis jobs from sessions."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fastapi.testclient import TestClient

from services.common.bus.connection import connect
from services.common.bus.keys import Keys
from services.common.bus.messages import TtsJob
from services.tts.app import create_app
from services.tts.engines.base import AudioF32, SpeechRequest
from services.tts.engines.espeak import EspeakEngine
from services.tts.settings import EspeakSettings, TtsSettings
from tests.component.test_voice_library import read_until_done
from tests.conftest import RedisProc

STYLE = {"exaggeration": 1.5, "cfg_weight": 0.2, "temperature": 0.6}


class StyleSpy(EspeakEngine):
    """The real espeak engine, noting the style of every request."""

    def __init__(self) -> None:
        super().__init__(EspeakSettings())
        self.styles: list[dict[str, float | None]] = []

    def synthesize(self, request: SpeechRequest) -> Iterator[AudioF32]:
        self.styles.append({name: getattr(request, name) for name in STYLE})
        return super().synthesize(request)


async def submit_job(redis_settings: Any, style: dict[str, float]) -> list[dict[str, Any]]:
    redis = connect(redis_settings)
    reply_to = f"{redis_settings.prefix}:test:style:{len(style)}"
    job = TtsJob(
        job_id=f"job-style-{len(style)}",  # distinct ids: a repeated id is dropped as a repeat
        session_id="s1",
        response_id="r1",
        seq=0,
        text="hello there",
        voice="default",
        sample_rate=16000,
        reply_to=reply_to,
        **style,  # type: ignore[arg-type]
    )
    try:
        await redis.xadd(Keys(redis_settings.prefix).jobs("tts"), {b"meta": job.dump()})
        return await read_until_done(redis, reply_to)
    finally:
        await redis.aclose()


def test_style_reaches_the_engine_from_every_door(redis_server: RedisProc) -> None:
    engine = StyleSpy()
    settings = TtsSettings(redis=redis_server.settings())
    with TestClient(create_app(settings, engine)) as client:
        with client.websocket_connect("/v1/stream/tts") as ws:
            assert ws.receive_json()["type"] == "ready"
            ws.send_json({"type": "speak", "id": "a", "text": "hi there", **STYLE})
            while (message := ws.receive())["type"] == "websocket.send":
                if "text" in message and '"audio.done"' in message["text"]:
                    break
            ws.send_json({"type": "speak", "id": "b", "text": "hi", "exaggeration": 9})
            error = ws.receive_json()
            assert error["type"] == "error" and error["code"] == "invalid_message"
        speech = {"model": "tts-1", "input": "hi there", "voice": "alloy", **STYLE}
        assert client.post("/v1/audio/speech", json=speech).status_code == 200
        results = client.portal.call(submit_job, settings.redis, STYLE)  # type: ignore[union-attr]
        assert results[-1]["kind"] == "tts.done"
        plain = client.portal.call(submit_job, settings.redis, {})  # type: ignore[union-attr]
        assert plain[-1]["kind"] == "tts.done"
    none = dict.fromkeys(STYLE)
    assert engine.styles == [STYLE, STYLE, STYLE, none]
