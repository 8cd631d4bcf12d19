"""The ASR service's doors when things go wrong: a REST client that hangs up, a
`/v1/stream/asr` client that commits faster than its finals come, a model call that
raises, a failure outside any segment (docs/protocol.md, docs/rest.md).

The engine is the fake one with a model that the test holds (every call waits at a gate)
or makes fail, and whole-file work whose steps it watches; the VAD is the real one."""

from __future__ import annotations

import asyncio
import io
import queue
import threading
import uuid
import wave
from collections.abc import Generator, Iterator, Sequence
from functools import cache
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import pytest
import websockets
import websockets.asyncio.client
from websockets.asyncio.client import ClientConnection

from services.asr.app import create_app
from services.asr.engines.base import AsrInput, FileRequest, FileTranscript, Transcript
from services.asr.engines.fake import FakeAsrEngine
from services.asr.settings import AsrSettings, FakeAsrSettings
from services.asr.stream import MAX_PENDING_FINALS
from services.common.audio.listener import Listener
from tests.conftest import RedisProc
from tests.e2e.wire import read_to_close, recv_json, send_json
from tests.servers import ServerThread
from tests.speech import speak, to_pcm16

RATE = 16000
FILE_STEPS = 50
"""Steps of a whole-file decode (a real engine takes one per 30 s window)."""
SECRET = "/secret/path/ctranslate2.cc:123"


class HeldEngine(FakeAsrEngine):
    """The fake engine, whose model calls wait at `gate` (held while it is clear) and raise
    while `failing`, and whose whole-file work says how it ended: closed part-way (its
    caller went away) or run to its end."""

    def __init__(self) -> None:
        super().__init__(FakeAsrSettings())
        self.gate = threading.Event()
        self.failing = False
        self.step_started = threading.Event()
        self.batch_started = threading.Event()
        self.file_ended: queue.Queue[str] = queue.Queue()
        self.steps = 0

    def reset(self) -> None:
        self.gate.set()
        self.failing = False
        self.step_started.clear()
        self.batch_started.clear()
        self.calls = 0
        self.file_ended = queue.Queue()
        self.steps = 0

    def transcribe_batch(self, items: Sequence[AsrInput]) -> list[Transcript]:
        self.batch_started.set()
        assert self.gate.wait(60), "the test never opened the gate"
        if self.failing:  # as a CUDA out-of-memory error comes
            raise RuntimeError(f"CUDA failed with error out of memory at {SECRET}")
        return super().transcribe_batch(items)

    def file_steps(self, request: FileRequest) -> Generator[None, None, FileTranscript]:
        try:
            for _ in range(FILE_STEPS):
                self.steps += 1
                self.step_started.set()
                assert self.gate.wait(60), "the test never opened the gate"
                yield
        except GeneratorExit:
            self.file_ended.put("closed")
            raise
        self.file_ended.put("finished")
        return self.transcribe_file(request)


class Endings:
    """An ASGI wrapper that records how each WebSocket's handler ended (None: it returned;
    else what it raised), by the `x-test-connection` header of the upgrade."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._ended: dict[str, BaseException | None] = {}
        self._changed = threading.Condition()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        name = dict(scope["headers"]).get(b"x-test-connection", b"").decode()
        outcome: BaseException | None = None
        try:
            await self.app(scope, receive, send)
        except BaseException as exc:
            outcome = exc
            raise
        finally:
            with self._changed:
                self._ended[name] = outcome
                self._changed.notify_all()

    def wait(self, name: str, timeout_s: float = 30.0) -> BaseException | None:
        with self._changed:
            assert self._changed.wait_for(lambda: name in self._ended, timeout_s), name
            return self._ended[name]


class Service:
    def __init__(self, server: ServerThread, engine: HeldEngine, endings: Endings) -> None:
        self.server = server
        self.engine = engine
        self.endings = endings

    def url(self, partials: bool = False) -> str:
        return f"{self.server.ws}/v1/stream/asr?partials={str(partials).lower()}"

    def connect(self, name: str, partials: bool = False) -> websockets.asyncio.client.connect:
        return websockets.asyncio.client.connect(
            self.url(partials),
            compression=None,
            max_size=None,
            max_queue=None,
            additional_headers={"x-test-connection": name},
        )


@pytest.fixture(scope="module")
def service(redis_server: RedisProc) -> Iterator[Service]:
    engine = HeldEngine()
    engine.reset()
    settings = AsrSettings(profile="fake", redis=redis_server.settings())
    endings = Endings(create_app(settings, engine=engine))
    try:
        with ServerThread(endings) as server:
            yield Service(server, engine, endings)
    finally:
        engine.gate.set()


@pytest.fixture
def asr(service: Service) -> Iterator[Service]:
    service.engine.reset()
    yield service
    service.engine.reset()  # a held model call never outlives its test


@cache
def _voiced_speech() -> npt.NDArray[np.float32]:
    """Half a second of silence, then a sentence with no silence after it: a segment the
    VAD has opened and not ended."""
    audio = speak("what is the weather like in paris today", RATE)
    loud = np.flatnonzero(np.abs(audio) > 0.01)
    return np.concatenate([np.zeros(RATE // 2, np.float32), audio[loud[0] : loud[-1] + 1]])


async def _send_speech(ws: ClientConnection) -> None:
    await _send(ws, _voiced_speech())


async def _send(ws: ClientConnection, audio: npt.NDArray[np.float32]) -> None:
    pcm = to_pcm16(audio)
    for start in range(0, len(pcm), 640):  # 20 ms frames, at once
        await ws.send(pcm[start : start + 640])


async def _until(condition: Any, timeout_s: float = 30.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not await condition():
            await asyncio.sleep(0.02)


# ---------------------------------------------------------------- REST: the client hangs up


def _wav(seconds: float) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(RATE)
        wav.writeframes(np.zeros(int(RATE * seconds), np.int16).tobytes())
    return out.getvalue()


def _raw_upload(port: int, fmt: str) -> bytes:
    """A transcription request, as bytes for a socket of our own."""
    request = httpx.Request(
        "POST",
        f"http://127.0.0.1:{port}/v1/audio/transcriptions",
        files={"file": ("speech.wav", _wav(2.0), "audio/wav")},
        data={"model": "whisper-1", "response_format": fmt},
    )
    body = request.read()
    head = (
        f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: {request.headers['content-type']}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _cancelled_uploads(http: str) -> float:
    async with httpx.AsyncClient(timeout=10) as client:
        page = (await client.get(f"{http}/metrics")).text
    wanted = ('outcome="cancelled"', 'route="transcriptions"', 'service="asr"')
    for line in page.splitlines():
        if line.startswith("va_requests_total{") and all(w in line for w in wanted):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def _queue_depth(client: httpx.AsyncClient, http: str) -> int:
    return int((await client.get(f"{http}/health")).json()["queue_depth"])


async def test_asr_upload_stops_when_its_client_hangs_up(asr: Service) -> None:
    """A whole-file decode whose client hangs up stops at its next step, and is counted
    as cancelled (it ran to its end, and counted `ok`, while nobody was there to read)."""
    engine, server = asr.engine, asr.server
    before = await _cancelled_uploads(server.http)
    engine.gate.clear()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(_raw_upload(server.port, "verbose_json"))
    await writer.drain()
    assert await asyncio.to_thread(engine.step_started.wait, 30), "the decode never started"
    writer.close()  # the client hangs up with its first window being decoded
    await writer.wait_closed()

    async def counted() -> bool:
        return await _cancelled_uploads(server.http) == before + 1

    await _until(counted)
    engine.gate.set()
    ended = await asyncio.to_thread(engine.file_ended.get, True, 30)
    assert (ended, engine.steps) == ("closed", 1)
    async with httpx.AsyncClient(timeout=10) as client:
        health = (await client.get(f"{server.http}/health")).json()
    assert health["queue_depth"] == 0
    assert await reader.read() == b""  # no answer was sent


async def test_asr_upload_waiting_for_the_model_is_dropped_when_its_client_hangs_up(
    asr: Service,
) -> None:
    """A plain upload (the batched path) waiting behind another for the model, whose client
    hangs up, never reaches the model; counted as cancelled (it was transcribed and counted
    `ok` all the same)."""
    engine, server = asr.engine, asr.server
    before = await _cancelled_uploads(server.http)
    engine.gate.clear()
    async with httpx.AsyncClient(timeout=30) as client:
        form = {"model": "whisper-1", "response_format": "json"}
        first = asyncio.create_task(
            client.post(
                f"{server.http}/v1/audio/transcriptions",
                files={"file": ("first.wav", _wav(1.0), "audio/wav")},
                data=form,
            )
        )
        assert await asyncio.to_thread(engine.batch_started.wait, 30), "the model never started"
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(_raw_upload(server.port, "json"))
        await writer.drain()

        async def waiting() -> bool:
            return await _queue_depth(client, server.http) == 1

        await _until(waiting)  # the second upload waits for the model, held by the first
        writer.close()
        await writer.wait_closed()

        async def counted() -> bool:
            return await _cancelled_uploads(server.http) == before + 1

        await _until(counted)
        engine.gate.set()
        answer = await first
        assert answer.status_code == 200 and answer.json()["text"] == "hello there"

        async def idle() -> bool:
            return await _queue_depth(client, server.http) == 0

        await _until(idle)
    assert engine.calls == 1  # the first upload's call alone
    assert await reader.read() == b""


# ---------------------------------------------------------------- stream: finals on their way


async def test_asr_stream_refuses_commits_past_its_finals_on_their_way(asr: Service) -> None:
    """With the model held, a commit ends the open segment (its final waits for the model)
    and the next ones queue empty finals behind it, up to MAX_PENDING_FINALS in all; the
    commits past that get a non-fatal `capacity` error each (they were all kept, one task
    each waiting for the one before). Once the model answers, every final queued comes, in
    order, and the stream goes on."""
    extra = 10
    async with asr.connect("refuse") as ws:
        assert (await recv_json(ws))["type"] == "ready"
        asr.engine.gate.clear()
        await _send_speech(ws)
        for _ in range(MAX_PENDING_FINALS + extra):
            await send_json(ws, {"type": "commit"})
        started = await recv_json(ws)
        assert started["type"] == "speech.started", started
        refused = [await recv_json(ws) for _ in range(extra)]
        assert {(e["type"], e["code"], e["fatal"], e.get("id")) for e in refused} == {
            ("error", "capacity", False, None)
        }, refused
        asr.engine.gate.set()
        finals = [await recv_json(ws) for _ in range(MAX_PENDING_FINALS)]
        assert [e["type"] for e in finals] == ["transcript.final"] * MAX_PENDING_FINALS
        assert finals[0]["segment_id"] == started["segment_id"]
        assert finals[0]["text"] == "hello there"
        assert {e["text"] for e in finals[1:]} == {""}
        await send_json(ws, {"type": "commit"})  # room again: answered as ever
        again = await recv_json(ws)
        assert (again["type"], again["text"]) == ("transcript.final", "")
        await send_json(ws, {"type": "close"})
        seen, code = await read_to_close(ws)
    assert (seen, code) == ([], 1000)
    assert asr.endings.wait("refuse") is None


async def test_asr_stream_segment_ended_past_the_cap_gets_capacity_with_its_id(
    asr: Service,
) -> None:
    """A segment the VAD ends while MAX_PENDING_FINALS finals are on their way is lost
    with a non-fatal `capacity` error carrying its id; the finals before it all come."""
    silence = np.zeros(3 * RATE // 2, np.float32)
    async with asr.connect("segment-refused") as ws:
        assert (await recv_json(ws))["type"] == "ready"
        asr.engine.gate.clear()
        await _send_speech(ws)
        for _ in range(MAX_PENDING_FINALS - 1):  # the first ends the segment: one short
            await send_json(ws, {"type": "commit"})
        for _ in range(2):  # the VAD ends these two: the first fills the queue
            await _send_speech(ws)
            await _send(ws, silence)
        started = [await recv_json(ws) for _ in range(3)]
        assert [e["type"] for e in started] == ["speech.started"] * 3, started
        refused = await recv_json(ws)
        assert (refused["type"], refused["code"], refused["fatal"], refused["id"]) == (
            "error",
            "capacity",
            False,
            started[2]["segment_id"],
        ), refused
        asr.engine.gate.set()
        finals = [await recv_json(ws) for _ in range(MAX_PENDING_FINALS)]
        assert [(e["type"], e["text"]) for e in finals] == [
            ("transcript.final", "hello there"),
            *[("transcript.final", "")] * (MAX_PENDING_FINALS - 2),
            ("transcript.final", "hello there"),
        ]
        assert [finals[0]["segment_id"], finals[-1]["segment_id"]] == [
            e["segment_id"] for e in started[:2]
        ]
        await send_json(ws, {"type": "close"})
        seen, code = await read_to_close(ws)
    assert (seen, code) == ([], 1000)
    assert asr.endings.wait("segment-refused") is None


async def test_asr_stream_client_leaves_with_thousands_of_commits_unanswered(
    asr: Service,
) -> None:
    """3000 commits behind a final the model holds, then the client leaves: the connection
    ends cleanly (each waited for the one before, and cancelling that chain at the close
    overflowed the stack: RecursionError)."""
    async with asr.connect("leave") as ws:
        assert (await recv_json(ws))["type"] == "ready"
        asr.engine.gate.clear()
        await _send_speech(ws)
        for _ in range(3000):
            await send_json(ws, {"type": "commit"})
    assert ws.close_code == 1000
    assert asr.endings.wait("leave") is None


# ---------------------------------------------------------------- stream: failures


async def test_asr_stream_model_failure_loses_only_the_segment(asr: Service) -> None:
    """A model call that raises (as a CUDA out-of-memory error does) fails the segment of
    each stream it was for with a non-fatal `internal` error naming only its kind, and the
    streams go on (they were dropped with no close frame). A failed partial is dropped."""
    asr.engine.failing = True
    async with asr.connect("fail-a", partials=True) as a, asr.connect("fail-b") as b:
        streams = (a, b)
        for ws in streams:
            assert (await recv_json(ws))["type"] == "ready"
            await _send_speech(ws)
            await send_json(ws, {"type": "commit"})
        failures = [[await recv_json(ws, 20), await recv_json(ws, 20)] for ws in streams]
        asr.engine.failing = False
        for ws in streams:
            await _send_speech(ws)
            await send_json(ws, {"type": "close"})
        endings = [await read_to_close(ws, 20) for ws in streams]
    for (started, failed), (seen, code) in zip(failures, endings, strict=True):
        assert started["type"] == "speech.started", started
        assert failed == {
            "type": "error",
            "code": "internal",
            "message": "internal error (RuntimeError)",
            "fatal": False,
            "id": started["segment_id"],
        }
        finals = [e for e in seen if e["type"] == "transcript.final"]
        assert [e["text"] for e in finals] == ["hello there"], seen
        assert code == 1000
    assert asr.endings.wait("fail-a") is None
    assert asr.endings.wait("fail-b") is None


async def test_asr_stream_unexpected_failure_is_fatal_internal_1011(
    asr: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure outside any segment's transcription (here the VAD's) ends the stream
    with a fatal `internal` error naming only its kind, then close 1011 (it was dropped
    with no close frame: the client saw 1006)."""

    async def broken(self: Listener, pcm: bytes) -> list[Any]:
        raise RuntimeError(f"VAD failed at {SECRET}")

    monkeypatch.setattr(Listener, "push_batched", broken)
    name = f"broken-{uuid.uuid4().hex[:6]}"
    async with asr.connect(name) as ws:
        assert (await recv_json(ws))["type"] == "ready"
        await ws.send(b"\x00\x00" * 320)
        seen, code = await read_to_close(ws)
    assert seen == [
        {
            "type": "error",
            "code": "internal",
            "message": "internal error (RuntimeError)",
            "fatal": True,
        }
    ]
    assert code == 1011
    assert asr.endings.wait(name) is None
