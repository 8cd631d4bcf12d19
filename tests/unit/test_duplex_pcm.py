"""`/v1/stream/duplex` over a real server with the fake (echo) engine and a real Redis: the
wire contract, admission at max_sessions (1013), bad input, closing, auth."""

from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import pytest
import websockets
from websockets.asyncio.client import connect

from services.common.auth.settings import AuthSettings
from services.duplex.settings import FakeDuplexSettings
from tests.conftest import RedisProc
from tests.duplex_client import (
    FRAME,
    duplex_server,
    histogram_count_above,
    metric,
    receive,
    tone,
)


async def test_echo_comes_back_resampled_with_text(redis_server: RedisProc) -> None:
    with duplex_server(redis_server.settings(), engine="fake") as server:
        url = f"{server.ws}/v1/stream/duplex?input_sample_rate=16000&output_sample_rate=16000"
        async with connect(url) as ws:
            ready = json.loads(await ws.recv())
            assert ready == {
                "type": "ready",
                "session_id": ready["session_id"],
                "input_sample_rate": 16000,
                "output_sample_rate": 16000,
                "frame_ms": 80,
                "engine": "fake",
                "model": "echo",
            }
            sent = tone(12, rate=16000)  # the input resampler holds a little back
            for start in range(0, len(sent), 640):  # 20 ms frames, as a gateway sends them
                await ws.send(sent[start : start + 640])
            heard = await receive(ws, 10)
    samples = heard.samples()
    assert samples.size == pytest.approx(10 * 1280, abs=2 * 1280)  # resampler latency aside
    assert np.abs(samples[: 1280 // 2]).max() <= 1  # the echo is one frame late: silence first
    assert np.abs(samples).max() > 0.1 * 32767
    assert [event["delta"] for event in heard.text][:2] == [" w5", " w10"]
    assert [event["audio_ms"] for event in heard.text][:2] == [320, 720]  # 5th and 10th frame


async def test_two_sessions_are_stepped_together(redis_server: RedisProc) -> None:
    # a step takes a model's 80 ms: the instant fake stepped a's 8 frames before b's message
    # was read once in a fresh-clone run, and a batch takes only the frames already there
    fake = FakeDuplexSettings(step_ms=80)
    with duplex_server(
        redis_server.settings(), engine="fake", gather_ms=2_000, fake=fake
    ) as server:
        before = histogram_count_above(server.http, "va_duplex_step_batch_size", 1)
        url = f"{server.ws}/v1/stream/duplex"
        async with connect(url) as a, connect(url) as b:
            for ws in (a, b):
                await ws.recv()  # ready
            for ws in (a, b):
                await ws.send(tone(8))
            await asyncio.gather(receive(a, 8), receive(b, 8))
        assert histogram_count_above(server.http, "va_duplex_step_batch_size", 1) > before


async def test_a_session_beyond_max_sessions_is_refused_with_1013(
    redis_server: RedisProc,
) -> None:
    with duplex_server(
        redis_server.settings(), engine="fake", max_sessions=1, retry_after_s=7
    ) as server:
        url = f"{server.ws}/v1/stream/duplex"
        refused = metric(server.http, "va_duplex_sessions_refused_total")
        async with connect(url) as first:
            assert json.loads(await first.recv())["type"] == "ready"
            async with connect(url) as second:
                error = json.loads(await second.recv())
                with pytest.raises(websockets.ConnectionClosed):
                    await second.recv()
            assert error["code"] == "capacity" and error["fatal"] is True
            assert second.close_code == 1013
            assert "retry after 7 s" in (second.close_reason or "")
            health = httpx.get(f"{server.http}/health", timeout=10).json()
            assert (health["sessions"], health["max_sessions"]) == (1, 1)
            await first.send(tone(2))
            await receive(first, 2)  # the admitted session is served all along
        assert metric(server.http, "va_duplex_sessions_refused_total") == refused + 1
        async with connect(url) as again:  # the slot is free once the first one closed
            assert json.loads(await again.recv())["type"] == "ready"


async def test_bad_messages_cost_an_error_not_the_session(redis_server: RedisProc) -> None:
    with duplex_server(redis_server.settings(), engine="fake") as server:
        async with connect(f"{server.ws}/v1/stream/duplex") as ws:
            await ws.recv()
            await ws.send(b"\x01\x02\x03")  # odd length: not PCM16
            odd = json.loads(await ws.recv())
            await ws.send('{"type":"dance"}')
            unknown = json.loads(await ws.recv())
            await ws.send(tone(1))
            heard = await receive(ws, 1)
            await ws.send('{"type":"close"}')
            with pytest.raises(websockets.ConnectionClosed):
                await ws.recv()
    assert (odd["code"], odd["fatal"]) == ("invalid_audio", False)
    assert (unknown["code"], unknown["fatal"]) == ("invalid_message", False)
    assert len(heard.audio) == 1
    assert ws.close_code == 1000


async def test_an_unsupported_rate_is_refused_with_1008(redis_server: RedisProc) -> None:
    with duplex_server(redis_server.settings(), engine="fake") as server:
        async with connect(f"{server.ws}/v1/stream/duplex?input_sample_rate=22050") as ws:
            error = json.loads(await ws.recv())
            with pytest.raises(websockets.ConnectionClosed):
                await ws.recv()
    assert error["code"] == "unsupported_sample_rate"
    assert ws.close_code == 1008


async def test_a_client_close_is_answered_at_once_and_frees_the_slot(
    redis_server: RedisProc,
) -> None:
    with duplex_server(
        redis_server.settings(), engine="fake", max_sessions=1, max_input_frames=1
    ) as server:
        url = f"{server.ws}/v1/stream/duplex"
        ws = await connect(url)
        await ws.recv()
        await ws.send(tone(20))  # more than its input holds: the reader waits for room
        async with asyncio.timeout(10):
            await ws.close()
        assert ws.close_code == 1000
        async with asyncio.timeout(10):
            while httpx.get(f"{server.http}/health", timeout=10).json()["sessions"]:
                await asyncio.sleep(0.01)
        async with connect(url) as again:
            assert json.loads(await again.recv())["type"] == "ready"


async def test_a_close_frees_the_slot_at_once_while_the_model_is_behind(
    redis_server: RedisProc,
) -> None:
    """The model takes a second a step (12 times slower than real time) and the session's
    input is full: its close is read ahead of the frames waiting for room and frees the
    slot at once, so the client's reconnect is served (the slot waited for the model to take
    every frame left, a second each, and a reconnect got 1013 meanwhile)."""
    fake = FakeDuplexSettings(step_ms=1_000)
    with duplex_server(
        redis_server.settings(), engine="fake", max_sessions=1, max_input_frames=1, fake=fake
    ) as server:
        url = f"{server.ws}/v1/stream/duplex"
        ws = await connect(url, close_timeout=60)
        await ws.recv()
        await ws.send(tone(20))  # 20 frames: the reader waits for room, a step each
        async with asyncio.timeout(10):
            await ws.close()
        assert ws.close_code == 1000
        async with asyncio.timeout(8):  # the defect: 18 s or more (a step per frame left)
            while httpx.get(f"{server.http}/health", timeout=10).json()["sessions"]:
                await asyncio.sleep(0.02)
        async with connect(url) as again:
            assert json.loads(await again.recv())["type"] == "ready"


async def test_without_a_credential_the_handshake_is_refused(redis_server: RedisProc) -> None:
    auth = AuthSettings(required=True, token_secret="s" * 40)
    with duplex_server(redis_server.settings(), engine="fake", auth=auth) as server:
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with connect(f"{server.ws}/v1/stream/duplex"):
                pass
        assert refused.value.response.status_code == 401
        with pytest.raises(websockets.InvalidStatus):
            async with connect(f"{server.ws}/api/chat"):
                pass
        assert httpx.get(f"{server.http}/ready", timeout=10).status_code == 200


def test_the_fake_frame_size_is_the_models() -> None:
    assert FRAME == 1920
