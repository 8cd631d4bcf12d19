"""Every WebSocket answers a close at once, whatever it is doing, and stops that
connection's work: closed while audio flows on `/v1/stream`, `/v1/realtime` (agent audio)
`/v1/stream/tts` (a long `speak`) and `/v1/stream/asr` (the client's microphone).

The client reads everything the server sends (as a client that is still listening does):
a client that has stopped reading with more frames queued than its library's `max_queue`
(websockets: 16) pauses its own socket and cannot see the server's answer, whatever the
server does (python-websockets/websockets#1555; docs/protocol.md, "Closing"). The close is
timed to 0.5 s here (the defect took 10 s; on a quiet machine it takes 1–3 ms: a bound
this loose keeps a loaded machine from failing it).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import websockets
from websockets.asyncio.client import ClientConnection

from services.common.bus.settings import RedisSettings
from services.gateway.admission import AdmissionSettings
from services.gateway.app import create_app
from services.gateway.settings import GatewaySection, GatewaySettings
from services.ops.redis_server import free_port, start_redis
from services.tts.app import create_app as tts_app
from services.tts.settings import TtsSettings
from tests.conftest import RedisProc, Stack, start_stack
from tests.servers import ServerThread
from tests.speech import speak, to_pcm16

CLOSE_BOUND_S = 0.5
LONG_TEXT = " ".join(["This sentence is long enough to keep the speaker busy."] * 12)


@pytest.fixture(scope="module")
def stack(redis_server: RedisProc) -> Iterator[Stack]:
    with start_stack(redis_server.settings(), profile="fake") as started:
        yield started


class Reader:
    """Reads every frame until the connection ends; counts audio."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.audio = 0
        self.texts: list[dict[str, object]] = []
        self.flowing = asyncio.Event()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            async for frame in self.ws:
                if isinstance(frame, bytes):
                    self.audio += 1
                else:
                    event = json.loads(frame)
                    self.texts.append(event)
                    if "delta" in event and "audio" in str(event.get("type")):
                        self.audio += 1
                if self.audio >= 5:
                    self.flowing.set()
        except websockets.ConnectionClosed:
            pass


async def timed_close(ws: ClientConnection) -> float:
    started = time.perf_counter()
    await ws.close()
    return time.perf_counter() - started


async def until(condition: Callable[[], Awaitable[bool]], timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not await condition():
            await asyncio.sleep(0.02)


async def active(server_http: str) -> int:
    async with httpx.AsyncClient(timeout=5) as http:
        health = (await http.get(f"{server_http}/health")).json()
    return int(health["active_connections"])


@pytest.mark.parametrize("path", ["/v1/stream", "/v1/realtime"])
async def test_the_gateway_answers_a_close_while_the_agent_speaks(stack: Stack, path: str) -> None:
    ws = await websockets.connect(f"{stack.gateway.ws}{path}", max_queue=None)
    reader = Reader(ws)
    if path == "/v1/stream":
        await ws.send(json.dumps({"type": "response.create", "text": LONG_TEXT}))
    else:
        item = {"type": "message", "role": "user", "content": [{"type": "input_text"}]}
        item["content"][0]["text"] = LONG_TEXT  # type: ignore[index]
        await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
        await ws.send(json.dumps({"type": "response.create"}))
    await asyncio.wait_for(reader.flowing.wait(), 20)
    took = await timed_close(ws)
    print(f"close answered in {took * 1000:.1f} ms")
    assert took < CLOSE_BOUND_S
    assert ws.close_code == 1000
    await reader.task
    # the session is released and its reply stopped: no socket left, nothing more sent
    await until(lambda: _is(active(stack.gateway.http), 0))


async def test_the_tts_stream_answers_a_close_while_it_speaks(stack: Stack) -> None:
    ws = await websockets.connect(f"{stack.tts.ws}/v1/stream/tts", max_queue=None)
    reader = Reader(ws)
    await ws.send(json.dumps({"type": "speak", "id": "long", "text": LONG_TEXT}))
    await asyncio.wait_for(reader.flowing.wait(), 20)
    took = await timed_close(ws)
    print(f"close answered in {took * 1000:.1f} ms")
    assert took < CLOSE_BOUND_S
    assert ws.close_code == 1000
    await reader.task
    await until(lambda: _is(active(stack.tts.http), 0))


async def test_the_asr_stream_answers_a_close_while_audio_comes_in(stack: Stack) -> None:
    ws = await websockets.connect(f"{stack.asr.ws}/v1/stream/asr", max_queue=None)
    reader = Reader(ws)
    pcm = to_pcm16(np.tile(speak("one two three four five six", 16000), 4))
    for start in range(0, len(pcm) // 2, 640):  # 20 ms frames, at once
        await ws.send(pcm[start : start + 640])
    await asyncio.sleep(0)
    took = await timed_close(ws)
    print(f"close answered in {took * 1000:.1f} ms")
    assert took < CLOSE_BOUND_S
    assert ws.close_code == 1000
    await reader.task
    await until(lambda: _is(active(stack.asr.http), 0))


async def _is(value: Awaitable[int], expected: int) -> bool:
    return await value == expected


@pytest.mark.parametrize("what", ["session.update", "conversation.text", "response.cancel"])
async def test_the_gateway_answers_a_close_while_an_input_waits_on_redis(
    tmp_path: Path, what: str
) -> None:
    """An input whose handling waits on Redis (a save, a cancellation: here a Redis
    stopped with SIGSTOP) with one more frame behind it: the close is read and answered at
    once (it waited 10 s and ended 1006: the server stops reading while a message sits
    unread), and the session ends."""
    port = free_port()
    redis = start_redis(port, tmp_path)
    bus = RedisSettings(url=f"redis://127.0.0.1:{port}/0")
    section = GatewaySection(admission=AdmissionSettings(enabled=False))
    settings = GatewaySettings(profile="fake", redis=bus, gateway=section)
    try:
        with (
            ServerThread(tts_app(TtsSettings(profile="fake", redis=bus))),
            ServerThread(create_app(settings)) as gateway,
        ):
            ws = await websockets.connect(f"{gateway.ws}/v1/stream", max_queue=None)
            await ws.recv()  # session.created
            reader = Reader(ws)
            if what == "response.cancel":
                await ws.send(json.dumps({"type": "response.create", "text": LONG_TEXT}))
                await asyncio.wait_for(reader.flowing.wait(), 20)
            os.kill(redis.pid, signal.SIGSTOP)
            try:
                message = {
                    "session.update": {"type": "session.update", "session": {"voice": "x"}},
                    "conversation.text": {"type": "conversation.text", "text": "hello"},
                    "response.cancel": {"type": "response.cancel"},
                }[what]
                await ws.send(json.dumps(message))
                await ws.send(bytes(640))  # a live client's next 20 ms of audio
                await asyncio.sleep(0.2)  # the handling is now waiting on Redis
                took = await timed_close(ws)
            finally:
                os.kill(redis.pid, signal.SIGCONT)
            print(f"{what}: close answered in {took * 1000:.1f} ms")
            assert took < CLOSE_BOUND_S and ws.close_code == 1000, (took, ws.close_code)
            await reader.task
            await until(lambda: _is(active(gateway.http), 0), timeout_s=30)
    finally:
        redis.kill()
        redis.wait(10)
