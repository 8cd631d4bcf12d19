"""The duplex service end to end on a small random-weight Moshi (greedy, CPU): the PCM
stream and Moshi's own protocol (Opus through sphn), sessions batched in one step (from
/metrics), a session's answer unchanged by others joining and leaving, admission."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import numpy as np
import pytest
import sphn
import websockets
from websockets.asyncio.client import ClientConnection, connect

from services.duplex import moshi_chat, pcm
from tests.conftest import RedisProc
from tests.duplex.tiny import section
from tests.duplex_client import FRAME, Heard, duplex_server, histogram_count_above, receive
from tests.servers import ServerThread

FRAMES = 10
SILENT_STEPS = 2
"""A session's first frame is only encoded, and the LM's first step fills its delays."""


@pytest.fixture(scope="module")
def server(redis_server: RedisProc) -> Iterator[ServerThread]:
    fields = section(max_sessions=2, gather_ms=500.0).model_dump()
    with duplex_server(redis_server.settings(), **fields) as running:
        yield running


def speech(seed: int) -> list[bytes]:
    """FRAMES frames of quiet noise as PCM16 at 24 kHz, one message each."""
    rng = np.random.default_rng(seed)
    audio = (3000 * rng.standard_normal((FRAMES, FRAME))).astype("<i2")
    return [row.tobytes() for row in audio]


async def talk(ws: ClientConnection, frames: list[bytes]) -> Heard:
    for frame in frames:
        await ws.send(frame)
    return await receive(ws, len(frames) - SILENT_STEPS)


async def test_a_session_sounds_the_same_alone_and_in_a_batch(server: ServerThread) -> None:
    url = f"{server.ws}/v1/stream/duplex"
    mine = speech(1)
    async with connect(url) as ws:
        assert json.loads(await ws.recv())["engine"] == "moshi-random"
        alone = await talk(ws, mine)
    batched_before = histogram_count_above(server.http, "va_duplex_step_batch_size", 1)
    async with connect(url) as ws, connect(url) as other:
        await ws.recv(), await other.recv()
        for frame in mine[:4]:
            await ws.send(frame)
        first = await receive(ws, 4 - SILENT_STEPS)  # the other joins mid-way...
        for theirs, frame in zip(speech(2)[:5], mine[4:], strict=False):
            await other.send(theirs)
            await ws.send(frame)
        # stepped with ws, then it leaves mid-way (its close frees its slot at once: frames
        # it sent and the model has not taken yet would go with it)
        await receive(other, 5 - SILENT_STEPS)
        await other.close()
        for frame in mine[9:]:
            await ws.send(frame)
        rest = await receive(ws, FRAMES - 4)
    together = Heard(first.audio + rest.audio, first.text + rest.text)
    assert histogram_count_above(server.http, "va_duplex_step_batch_size", 1) > batched_before
    assert len(together.audio) == len(alone.audio) == FRAMES - SILENT_STEPS
    assert [t["delta"] for t in together.text] == [t["delta"] for t in alone.text]
    assert [t["audio_ms"] for t in together.text] == [t["audio_ms"] for t in alone.text]
    difference = np.abs(together.samples().astype(int) - alone.samples().astype(int))
    assert difference.max() <= 2  # the same frames, to PCM16 rounding
    assert np.abs(alone.samples()).max() > 0  # a random model still makes sound


async def test_moshi_clients_talk_opus_on_api_chat(server: ServerThread) -> None:
    writer, reader = sphn.OpusStreamWriter(24000), sphn.OpusStreamReader(24000)
    rng = np.random.default_rng(3)
    async with connect(f"{server.ws}/api/chat") as ws:
        assert await ws.recv() == b"\x00"  # the handshake: a slot is held
        for _ in range(FRAMES):
            packet = writer.append_pcm((0.1 * rng.standard_normal(FRAME)).astype(np.float32))
            if packet:
                await ws.send(b"\x01" + packet)
        audio, text = 0, []
        async with asyncio.timeout(60):
            while audio < (FRAMES - SILENT_STEPS - 1) * FRAME:
                message = await ws.recv()
                assert isinstance(message, bytes)
                if message[0] == 1:
                    audio += reader.append_bytes(message[1:]).size
                elif message[0] == 2:
                    text.append(message[1:].decode())
    assert audio >= (FRAMES - SILENT_STEPS - 1) * FRAME  # Opus back, decodable
    assert text and all(isinstance(piece, str) for piece in text)


async def test_beyond_max_sessions_both_protocols_are_refused_with_1013(
    server: ServerThread,
) -> None:
    async with connect(f"{server.ws}/v1/stream/duplex") as a, connect(f"{server.ws}/api/chat") as b:
        await a.recv()
        assert await b.recv() == b"\x00"
        async with connect(f"{server.ws}/api/chat") as refused:
            error = await refused.recv()
            with pytest.raises(websockets.ConnectionClosed):
                await refused.recv()
        assert isinstance(error, bytes) and error[:1] == b"\x05"
        assert b"capacity" in error and refused.close_code == 1013
        async with connect(f"{server.ws}/v1/stream/duplex") as again:
            assert json.loads(await again.recv())["code"] == "capacity"
            with pytest.raises(websockets.ConnectionClosed):
                await again.recv()
        assert again.close_code == 1013


async def test_a_bug_is_a_typed_internal_error_on_both_protocols(
    server: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure of ours mid-session: the PCM client reads a fatal `internal` error and
    1011, the Moshi client its error kind (0x05) and 1011, neither a bare close with the
    details (it used to escape to the server: a bare 1011)."""

    async def broken(*_: object) -> None:
        raise RuntimeError("a bug of ours, with a detail")

    monkeypatch.setattr(pcm, "_read", broken)
    monkeypatch.setattr(moshi_chat, "_read", broken)
    async with connect(f"{server.ws}/v1/stream/duplex") as ws:
        assert json.loads(await ws.recv())["type"] == "ready"
        error = json.loads(await ws.recv())
        with pytest.raises(websockets.ConnectionClosed):
            await ws.recv()
    assert (error["code"], error["fatal"]) == ("internal", True)
    assert error["message"] == "internal error (RuntimeError)"
    assert ws.close_code == 1011
    async with connect(f"{server.ws}/api/chat") as chat:
        assert await chat.recv() == b"\x00"
        told = await chat.recv()
        with pytest.raises(websockets.ConnectionClosed):
            await chat.recv()
    assert told == b"\x05internal error (RuntimeError)" and chat.close_code == 1011
