"""`/v1/stream/tts` over a real socket: cancels, a reused id, and failures of ours.

The engine is tests/component/test_tts_synthesis.py's `GatedEngine`: a text that starts
with "gated" speaks one piece, then stays in its next piece until the test releases it.
The tests wait on events; their timeouts only turn a hang into a failure.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from prometheus_client import REGISTRY
from websockets.asyncio.client import ClientConnection

from services.common.bus.settings import RedisSettings
from services.ops.redis_server import free_port
from services.tts import stream as tts_stream
from services.tts.app import create_app
from services.tts.settings import TtsSection, TtsSettings
from tests.component.test_tts_synthesis import PIECE, RATE, GatedEngine, wait_set
from tests.conftest import RedisProc
from tests.e2e.wire import Json, connect, read_to_close, recv_json, recv_until, send_json
from tests.servers import ServerThread

TIMEOUT_S = 20.0
"""Only turns a hang (the bug) into a failure."""


@dataclass
class Tts:
    server: ServerThread
    engine: GatedEngine

    @property
    def url(self) -> str:
        return f"{self.server.ws}/v1/stream/tts"


def _serve(redis: RedisSettings) -> Iterator[Tts]:
    engine = GatedEngine()
    settings = TtsSettings(redis=redis, tts=TtsSection(max_concurrent=1))
    try:
        with ServerThread(create_app(settings, engine)) as server:
            yield Tts(server, engine)
    finally:
        engine.release.set()


@pytest.fixture
def tts(redis_server: RedisProc) -> Iterator[Tts]:
    yield from _serve(redis_server.settings())


@pytest.fixture
def tts_without_redis() -> Iterator[Tts]:
    """A TTS service whose Redis does not answer (nothing listens on its port)."""
    down = RedisSettings(url=f"redis://127.0.0.1:{free_port()}/0", prefix="down")
    yield from _serve(down)


async def _ready(ws: ClientConnection) -> None:
    assert await recv_json(ws) == {"type": "ready"}


async def _speaking(ws: ClientConnection, tts: Tts, request_id: str) -> None:
    """Ask for a gated request; return once its first piece is here and the engine is in
    its second one."""
    await send_json(ws, {"type": "speak", "id": request_id, "text": "gated words"})
    start = await recv_json(ws, TIMEOUT_S)
    assert start == {"type": "audio.start", "id": request_id, "sample_rate": RATE}
    first = await ws.recv()
    assert isinstance(first, bytes) and len(first) == 2 * PIECE
    await wait_set(tts.engine.in_piece)


async def _served_whole(ws: ClientConnection, request_id: str, text: str) -> Json:
    """audio.start, the audio, audio.done `completed` of the next request, nothing else."""
    start, before, audio = await recv_until(ws, "audio.start", TIMEOUT_S)
    assert (start["id"], before, audio) == (request_id, [], b"")
    done, between, audio = await recv_until(ws, "audio.done", TIMEOUT_S)
    assert between == [] and audio
    assert (done["id"], done["status"]) == (request_id, "completed")
    assert done["audio_ms"] == round(len(audio) / 2 / RATE * 1000) == 100 * len(text.split())
    return done


def _cancelled() -> float:
    """`va_tts_cancelled_total` (the server runs in this process)."""
    return REGISTRY.get_sample_value("va_tts_cancelled_total") or 0.0


async def test_a_cancel_ends_the_request_while_the_engine_is_mid_piece(tts: Tts) -> None:
    """The cancel is answered (`audio.done` `cancelled`) while the engine is still in the
    middle of its piece (it used to be answered only once the engine's next piece was
    done); the engine is told to stop, nothing of that request comes after, and the slot
    it held serves the next request once the engine has returned. It counts once in
    `va_tts_cancelled_total` (which used to count only the bus's jobs)."""
    before = _cancelled()
    async with connect(tts.url) as ws:
        await _ready(ws)
        await _speaking(ws, tts, "x")
        await send_json(ws, {"type": "cancel", "id": "x"})
        done, between, audio = await recv_until(ws, "audio.done", TIMEOUT_S)
        assert not tts.engine.returned.is_set()  # answered with the engine mid-piece
        assert (done["id"], done["status"], done["audio_ms"]) == ("x", "cancelled", 200)
        assert (between, audio) == ([], b"")
        tts.engine.release.set()
        await wait_set(tts.engine.returned)
        assert tts.engine.stop_seen == [True]
        await send_json(ws, {"type": "speak", "id": "y", "text": "hello there"})
        await _served_whole(ws, "y", "hello there")
    assert _cancelled() - before == 1  # the request cancelled; not the one served whole


async def test_a_cancel_leaves_a_later_request_with_the_same_id_alone(tts: Tts) -> None:
    """speak `a`, cancel `a`, speak `a` again: the cancel is bound to the request it came
    for; the one sent after it is spoken whole (it used to be cancelled too, 0 ms)."""
    async with connect(tts.url) as ws:
        await _ready(ws)
        await _speaking(ws, tts, "a")
        await send_json(ws, {"type": "cancel", "id": "a"})
        await send_json(ws, {"type": "speak", "id": "a", "text": "said after the cancel"})
        tts.engine.release.set()  # whenever the first one ends, the second must be whole
        first, between, _ = await recv_until(ws, "audio.done", TIMEOUT_S)
        assert (first["id"], first["status"], between) == ("a", "cancelled", [])
        await _served_whole(ws, "a", "said after the cancel")
        # a cancel that comes after its request ended touches nothing either
        await send_json(ws, {"type": "cancel", "id": "a"})
        await send_json(ws, {"type": "speak", "id": "a", "text": "and again"})
        await _served_whole(ws, "a", "and again")


async def test_a_failure_of_ours_fails_the_message_not_the_connection(
    tts_without_redis: Tts,
) -> None:
    """Redis out of reach while a library voice is looked up: that message gets a
    non-fatal `internal` error with its id, the request being spoken goes on, and the
    connection serves the next one (it used to close 1000 with no error at all)."""
    tts = tts_without_redis
    async with connect(tts.url) as ws:
        await _ready(ws)
        await _speaking(ws, tts, "first")
        voice = "v_0123456789abcdef"
        await send_json(ws, {"type": "speak", "id": "lib", "text": "hi", "voice": voice})
        error = await recv_json(ws, TIMEOUT_S)
        assert error == {
            "type": "error",
            "code": "internal",
            "message": "internal error (ConnectionError)",
            "fatal": False,
            "id": "lib",
        }
        tts.engine.release.set()
        done, between, audio = await recv_until(ws, "audio.done", TIMEOUT_S)
        assert (done["id"], done["status"], between) == ("first", "completed", [])
        assert len(audio) == 2 * 3 * PIECE  # the rest of it: three more pieces
        await send_json(ws, {"type": "speak", "id": "next", "text": "still here"})
        await _served_whole(ws, "next", "still here")


async def test_an_error_that_escapes_is_a_fatal_internal_error_and_1011(
    tts: Tts, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure no message handling catches (here: in reporting a malformed message) ends
    the connection as the protocol says: a fatal `internal` error, then close 1011 (it
    used to be a close 1000 with no error)."""

    def broken(text: str | None) -> str | None:
        raise RuntimeError(f"broken {uuid.uuid4().hex}")

    monkeypatch.setattr(tts_stream, "_claimed_id", broken)
    async with connect(tts.url) as ws:
        await _ready(ws)
        await send_json(ws, {"type": "speak", "text": "no id"})
        events, code = await read_to_close(ws, TIMEOUT_S)
    assert events == [
        {
            "type": "error",
            "code": "internal",
            "message": "internal error (RuntimeError)",
            "fatal": True,
        }
    ]
    assert code == 1011
