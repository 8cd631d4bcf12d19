"""The official `openai` SDK against the TTS service's speech door: every format streams
(the first bytes come while the engine is still held on its second piece), SSE events as
OpenAI defines them, and `GET /v1/models` with `model=` checked."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator

import numpy as np
import openai
import pytest

from services.common.audio.pcm import decode_file
from services.tts.app import create_app
from services.tts.engines.base import SpeechRequest
from services.tts.engines.fake import FakeTtsEngine
from services.tts.settings import FakeTtsSettings, TtsSection, TtsSettings
from tests.conftest import RedisProc
from tests.servers import ServerThread

TEXT = "The first piece. The second piece comes once the test lets it."
FORMATS = ["mp3", "opus", "aac", "flac", "wav", "pcm"]
MAGIC = {"mp3": b"ID3", "opus": b"OggS", "flac": b"fLaC", "wav": b"RIFF", "aac": b"\xff\xf1"}


class GatedEngine(FakeTtsEngine):
    """The fake tone, one chunk per sentence; the second waits until the test opens the
    gate, so what the client holds before then came from the first piece alone."""

    def __init__(self) -> None:
        super().__init__(FakeTtsSettings(sample_rate=24000))
        self.gate = threading.Event()

    def synthesize(self, request: SpeechRequest) -> Iterator[np.ndarray]:
        for index, sentence in enumerate(request.text.split(". ")):
            if index and not self.gate.wait(timeout=60):
                raise TimeoutError("the test never opened the gate")
            yield np.concatenate(list(super().synthesize(SpeechRequest(sentence, "default"))))


@pytest.fixture(scope="module")
def engine() -> GatedEngine:
    return GatedEngine()


@pytest.fixture(scope="module")
def client(redis_server: RedisProc, engine: GatedEngine) -> Iterator[openai.OpenAI]:
    settings = TtsSettings(
        profile="fake", redis=redis_server.settings(), tts=TtsSection(engine="fake")
    )
    with (
        ServerThread(create_app(settings, engine)) as server,
        openai.OpenAI(
            base_url=f"{server.http}/v1", api_key="sk-local", max_retries=0, timeout=60
        ) as sdk,
    ):
        yield sdk


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_first_bytes_leave_with_the_first_piece(
    client: openai.OpenAI, engine: GatedEngine, fmt: str
) -> None:
    engine.gate.clear()
    with client.audio.speech.with_streaming_response.create(
        model="tts-1",
        voice="alloy",
        input=TEXT,
        response_format=fmt,  # type: ignore[arg-type]
    ) as response:
        pieces = response.iter_bytes()
        first = next(pieces)  # the second piece is still held: this is the first's audio
        assert first.startswith(MAGIC.get(fmt, b"")), first[:8]
        assert len(first) > 0
        engine.gate.set()
        data = first + b"".join(pieces)
    rate = 24000
    audio = np.frombuffer(data, "<i2") / 32768 if fmt == "pcm" else decode_file(data, rate)
    whole = sum(engine.duration_samples(s) for s in TEXT.split(". ")) / 24000
    assert audio.size / rate == pytest.approx(whole, abs=0.12), fmt  # both pieces, decodable


def test_sse_events_as_openai_defines_them(client: openai.OpenAI, engine: GatedEngine) -> None:
    engine.gate.set()
    with client.audio.speech.with_streaming_response.create(
        model="gpt-4o-mini-tts",
        voice="alloy",
        input=TEXT,
        response_format="pcm",
        stream_format="sse",
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [
            json.loads(line.removeprefix("data: "))
            for line in response.iter_lines()
            if line.startswith("data: ")
        ]
    deltas, done = events[:-1], events[-1]
    assert deltas and all(e["type"] == "speech.audio.delta" for e in deltas)
    pcm = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    whole = sum(engine.duration_samples(s) for s in TEXT.split(". "))
    assert len(pcm) == 2 * whole
    assert done["type"] == "speech.audio.done"
    usage = done["usage"]
    assert usage["input_tokens"] == len(TEXT)
    assert usage["output_tokens"] == round(1000 * whole / 24000)
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_models_are_listed_and_model_is_checked(client: openai.OpenAI, engine: GatedEngine) -> None:
    engine.gate.set()
    listed = list(client.models.list())
    assert [m.id for m in listed] == ["fake"]
    assert {"tts-1", "tts-1-hd", "gpt-4o-mini-tts"} <= set(listed[0].model_dump()["aliases"])
    assert client.models.retrieve("fake").id == "fake"
    for model in ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "fake"):
        audio = client.audio.speech.create(
            model=model, voice="alloy", input="hello", response_format="pcm"
        )
        assert len(audio.content) > 0
    with pytest.raises(openai.BadRequestError) as refused:
        client.audio.speech.create(model="tts-9", voice="alloy", input="hello")
    assert "unknown model 'tts-9'" in str(refused.value.body)
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("tts-9")
