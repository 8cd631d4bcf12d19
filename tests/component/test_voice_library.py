"""The voice library through the TTS app: real Redis, real espeak-ng, in-process HTTP.

Upload, list, delete; bad uploads are typed 400s and leave nothing behind; an
uploaded voice id works in `/v1/audio/speech` and `/v1/stream/tts` and stops
working everywhere once deleted.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from services.common.audio.pcm import encode_audio
from services.common.bus.connection import connect
from services.common.bus.keys import Keys
from services.common.bus.messages import TtsJob
from services.tts.app import create_app
from services.tts.engines.base import AudioF32, SpeechRequest
from services.tts.engines.espeak import EspeakEngine
from services.tts.engines.piper import PiperEngine
from services.tts.settings import (
    EspeakSettings,
    PiperSettings,
    TtsSection,
    TtsSettings,
    VoiceLibrarySettings,
)
from services.tts.voices import VOICE_ID
from tests.conftest import RedisProc

RATE = 24000


def voice_like(seconds: float, amplitude: float = 0.3) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    wave = sum(np.sin(2 * np.pi * f * t) / k for k, f in enumerate((140, 280, 420, 700), 1))
    return (amplitude * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t)) * wave / 2).astype(np.float32)


def wav(samples: np.ndarray) -> bytes:
    return encode_audio(samples.astype(np.float32), RATE, "wav")


GOOD = wav(voice_like(5.0))


@pytest.fixture
def voices_dir(tmp_path: Path) -> Path:
    return tmp_path / "voices"


class SpyEspeak(EspeakEngine):
    """The real espeak engine, noting which voice each synthesis speaks with."""

    def __init__(self) -> None:
        super().__init__(EspeakSettings())
        self.spoken: list[str] = []

    def synthesize(self, request: SpeechRequest) -> Iterator[AudioF32]:
        self.spoken.append(request.voice)
        return super().synthesize(request)


@pytest.fixture
def engine() -> SpyEspeak:
    return SpyEspeak()


@pytest.fixture
def client(redis_server: RedisProc, voices_dir: Path, engine: SpyEspeak) -> Iterator[TestClient]:
    section = TtsSection(voices=VoiceLibrarySettings(dir=voices_dir, max_upload_mb=0.5))
    app = create_app(TtsSettings(redis=redis_server.settings(), tts=section), engine)
    with TestClient(app) as test_client:
        yield test_client


def upload(client: TestClient, data: bytes, name: str = "Ada", **form: str) -> Any:
    files = {"file": ("clip.wav", data, "audio/wav")}
    return client.post("/v1/voices", files=files, data={"name": name, **form})


def library(client: TestClient) -> list[dict[str, Any]]:
    listed = client.get("/v1/voices").json()
    return [v for v in listed["voices"] if v["source"] == "library"]


def speech(client: TestClient, voice: str, text: str = "one two three") -> Any:
    body = {"model": "tts-1", "input": text, "voice": voice, "response_format": "pcm"}
    return client.post("/v1/audio/speech", json=body)


def test_upload_list_delete_round_trip(client: TestClient, voices_dir: Path) -> None:
    response = upload(client, GOOD, name="  Ada   Lovelace ")
    assert response.status_code == 201, response.text
    voice = response.json()
    assert VOICE_ID.match(voice["id"])
    assert voice["name"] == "Ada Lovelace"
    assert voice["duration_s"] == pytest.approx(5.0, abs=0.01)
    assert voice["engine"] == "espeak"
    assert (voices_dir / f"{voice['id']}.wav").is_file()
    listed = client.get("/v1/voices").json()
    assert listed["default"] == "en-us"
    assert listed["openai_voices"]["maps_to"] == listed["default"]
    assert any(v["source"] == "engine" and v["id"] == "en-us" for v in listed["voices"])
    assert [v["id"] for v in library(client)] == [voice["id"]]
    deleted = client.delete(f"/v1/voices/{voice['id']}")
    assert deleted.status_code == 200
    assert deleted.json() == {"id": voice["id"], "deleted": True}
    assert library(client) == []
    assert not (voices_dir / f"{voice['id']}.wav").exists()
    again = client.delete(f"/v1/voices/{voice['id']}")
    assert again.status_code == 404


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty"),
        (b"RIFF but not really a wave file" * 20, "not audio"),
        (wav(voice_like(1.0)), "too short"),
        (wav(np.zeros(RATE * 5, np.float32)), "silent"),
        (wav(np.clip(voice_like(5.0, 6.0), -1, 1)), "clipped"),
    ],
    ids=["empty", "not-audio", "short", "silent", "clipped"],
)
def test_bad_uploads_are_typed_400s(
    client: TestClient, voices_dir: Path, data: bytes, reason: str
) -> None:
    response = upload(client, data)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_audio"
    assert reason in error["message"]
    assert library(client) == []
    assert not voices_dir.exists() or not any(voices_dir.iterdir())


def test_an_upload_over_the_limit_is_a_413(client: TestClient, voices_dir: Path) -> None:
    response = upload(client, wav(voice_like(31.0, 0.01)[: RATE * 31]))  # over 0.5 MB
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_audio" and "exceeds" in error["message"]
    assert library(client) == []


def test_too_long_is_refused(redis_server: RedisProc, tmp_path: Path) -> None:
    section = TtsSection(voices=VoiceLibrarySettings(dir=tmp_path, max_duration_s=4.0))
    with TestClient(create_app(TtsSettings(redis=redis_server.settings(), tts=section))) as c:
        response = upload(c, GOOD)
    assert response.status_code == 400
    assert "too long (5.0 s)" in response.json()["error"]["message"]


def test_missing_name_and_bad_stand_in(client: TestClient) -> None:
    files = {"file": ("clip.wav", GOOD, "audio/wav")}
    assert client.post("/v1/voices", files=files).status_code == 400
    unknown = upload(client, GOOD, espeak_voice="xx-nowhere")
    assert unknown.status_code == 400
    assert "xx-nowhere" in unknown.json()["error"]["message"]
    assert library(client) == []  # rolled back


def test_uploaded_voice_speaks(client: TestClient, engine: SpyEspeak) -> None:
    plain = upload(client, GOOD).json()["id"]
    british = upload(client, GOOD, name="Brit", espeak_voice="en-gb").json()["id"]
    for voice in ("default", plain, british):
        response = speech(client, voice)
        assert response.status_code == 200, response.text
        assert len(response.content) > RATE  # over half a second of PCM16
    wav_body = {"input": "hello", "voice": british, "response_format": "wav"}
    assert client.post("/v1/audio/speech", json=wav_body).status_code == 200
    # espeak cannot clone: a library voice speaks with its stand-in, else the default
    assert engine.spoken == ["en-us", "en-us", "en-gb", "en-gb"]


class SpyPiper(PiperEngine):
    """The real Piper engine, noting which voice each synthesis speaks with."""

    def __init__(self) -> None:
        super().__init__(PiperSettings())
        self.spoken: list[str] = []

    def synthesize(self, request: SpeechRequest) -> Iterator[AudioF32]:
        self.spoken.append(request.voice)
        return super().synthesize(request)


def test_piper_speaks_a_library_voice_with_its_piper_stand_in(
    redis_server: RedisProc, voices_dir: Path
) -> None:
    piper = SpyPiper()
    section = TtsSection(voices=VoiceLibrarySettings(dir=voices_dir, max_upload_mb=0.5))
    app = create_app(TtsSettings(redis=redis_server.settings(), tts=section), piper)
    with TestClient(app) as client:
        plain = upload(client, GOOD).json()["id"]
        joe = upload(client, GOOD, name="Joe", piper_voice="joe").json()
        assert (joe["piper_voice"], joe["engine"]) == ("joe", "piper")
        unknown = upload(client, GOOD, piper_voice="nobody")
        assert unknown.status_code == 400, unknown.text
        assert "unknown Piper voice 'nobody'" in unknown.json()["error"]["message"]
        assert upload(client, GOOD, piper_voice="../joe").status_code == 400
        assert [v["name"] for v in library(client)] == ["Ada", "Joe"]  # the refused left none
        for voice in (plain, joe["id"]):
            assert speech(client, voice).status_code == 200
    assert piper.spoken[-2:] == ["joe", "joe"]


def test_deleted_voice_is_refused(client: TestClient) -> None:
    voice = upload(client, GOOD).json()["id"]
    assert speech(client, voice).status_code == 200
    assert client.delete(f"/v1/voices/{voice}").status_code == 200
    gone = speech(client, voice)
    assert gone.status_code == 400
    assert "deleted or never existed" in gone.json()["error"]["message"]
    never = speech(client, "v_0000000000000000")
    assert never.status_code == 400


def test_uploaded_voice_works_on_the_tts_stream(client: TestClient, engine: SpyEspeak) -> None:
    voice = upload(client, GOOD, espeak_voice="en-gb").json()["id"]
    with client.websocket_connect("/v1/stream/tts") as ws:
        assert json.loads(ws.receive_text())["type"] == "ready"
        ws.send_text(json.dumps({"type": "speak", "id": "r1", "text": "hello", "voice": voice}))
        assert json.loads(ws.receive_text())["type"] == "audio.start"
        audio = 0
        while True:
            message = ws.receive()
            if message.get("bytes"):
                audio += len(message["bytes"])
                continue
            done = json.loads(message["text"])
            break
    assert done["type"] == "audio.done" and done["status"] == "completed"
    assert audio > 0
    assert engine.spoken == ["en-gb"]


def test_a_clip_missing_on_this_host_comes_from_redis(client: TestClient, voices_dir: Path) -> None:
    voice = upload(client, GOOD).json()["id"]
    clip = voices_dir / f"{voice}.wav"
    stored = clip.read_bytes()
    clip.unlink()  # as on another TTS host sharing the Redis
    assert speech(client, voice).status_code == 200
    assert clip.read_bytes() == stored


def test_uploaded_voice_works_in_tts_jobs(
    redis_server: RedisProc, voices_dir: Path, engine: SpyEspeak
) -> None:
    """Gateway sessions reach the TTS service as Redis jobs whose `voice` is the id."""
    redis = redis_server.settings()
    section = TtsSection(voices=VoiceLibrarySettings(dir=voices_dir))
    app = create_app(TtsSettings(redis=redis, tts=section), engine)
    with TestClient(app) as client:
        voice = upload(client, GOOD, espeak_voice="en-gb").json()["id"]
        doomed = upload(client, GOOD).json()["id"]
        assert client.delete(f"/v1/voices/{doomed}").status_code == 200
        results = client.portal.call(run_jobs, redis, [voice, doomed])  # type: ignore[union-attr]
    assert results[0][-1]["kind"] == "tts.done" and results[0][-1]["status"] == "completed"
    assert any(r["kind"] == "tts.chunk" for r in results[0])
    assert results[1] == [results[1][0]] and results[1][0]["kind"] == "job.failed"
    assert "deleted or never existed" in results[1][0]["message"]
    assert engine.spoken == ["en-gb"]


async def run_jobs(redis_settings: Any, voices: list[str]) -> list[list[dict[str, Any]]]:
    redis = connect(redis_settings)
    keys = Keys(redis_settings.prefix)
    try:
        replies = []
        for i, voice in enumerate(voices):
            reply_to = f"{redis_settings.prefix}:test:replies:{i}"
            job = TtsJob(
                job_id=f"job-{i}",
                session_id="s1",
                response_id=f"r{i}",
                seq=0,
                text="hello there",
                voice=voice,
                sample_rate=16000,
                reply_to=reply_to,
            )
            await redis.xadd(keys.jobs("tts"), {b"meta": job.dump()})
            replies.append(await read_until_done(redis, reply_to))
        return replies
    finally:
        await redis.aclose()


async def read_until_done(redis: Any, stream: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    last = b"0"
    for _ in range(100):
        entries = await redis.xread({stream: last}, block=200)
        for _, items in entries:
            for entry_id, fields in items:
                last = entry_id
                found.append(json.loads(fields[b"meta"]))
        if found and found[-1]["kind"] in ("tts.done", "job.failed"):
            return found
    raise AssertionError(f"no terminal result on {stream}: {found}")
