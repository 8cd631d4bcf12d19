"""The whole stack under `VA_PROFILE=fake` (instant engines, still through Redis), and the
event-loop lag and process figures every service's /health reports."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from services.client.stream import StreamClient
from services.common.audio.pcm import pcm16_to_float
from tests.conftest import RedisProc, Stack, start_stack
from tests.speech import speak

LAG_FIELDS = {"window_s", "p50", "p99", "max", "samples"}


@pytest.fixture(scope="module")
def fake_stack(redis_server: RedisProc) -> Iterator[Stack]:
    """ASR, TTS and the gateway with `profile=fake` (`VA_PROFILE=fake`), on their own prefix."""
    with start_stack(redis_server.settings(), profile="fake") as stack:
        engines = [httpx.get(f"{s.http}/health").json()["engine"] for s in (stack.asr, stack.tts)]
        assert engines == ["fake", "fake"]
        yield stack


async def test_a_spoken_turn_on_the_fake_profile(fake_stack: Stack) -> None:
    async with StreamClient(fake_stack.stream_url) as client:
        turn = client.new_turn()
        await client.speak(speak("what is the weather like today", 16000), 16000)
        done = await client.silence_until("response.done", timeout_s=20)

    assert [e["text"] for e in turn.of_type("transcript.final")] == ["hello there"]
    assert done["status"] == "completed" and done["text"] == "hello there"
    audio = pcm16_to_float(bytes(turn.audio))
    rate = client.output_rate
    assert audio.size == pytest.approx(2 * 0.3 * rate, abs=rate // 50)  # two words, 300 ms each
    assert 0.02 < float(np.abs(audio).max()) < 0.05  # the quiet tone: audio, not silence
    async with httpx.AsyncClient(timeout=10) as http:
        health = (await http.get(f"{fake_stack.gateway.http}/health")).json()
    timings = health["timings_ms"]  # what the gateway itself added, from its own clock
    assert timings["hearing"]["samples"] >= 50  # every frame of the utterance and after
    assert timings["results"]["samples"] >= 3  # the transcript and the audio chunks
    assert 0 <= timings["hearing"]["p50"] <= timings["hearing"]["max"] < 1000


async def test_health_reports_lag_and_process(fake_stack: Stack) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        for name, server in fake_stack.servers.items():
            health = (await http.get(f"{server.http}/health")).json()
            assert health["service"] == name and health["model_loaded"] is True
            lag = health["event_loop_lag_ms"]
            assert lag.keys() == LAG_FIELDS and lag["window_s"] == 60
            assert lag["samples"] > 0 and 0 <= lag["p50"] <= lag["p99"] <= lag["max"]
            process = health["process"]
            assert process["rss_bytes"] > 50 << 20 and process["cpu_seconds"] > 0
            assert health["engine"] == {"asr": "fake", "tts": "fake"}.get(name, "silero-vad")


async def test_health_window_narrows_the_lag_samples(fake_stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=fake_stack.tts.http, timeout=10) as http:
        everything = (await http.get("/health", params={"window_s": 600})).json()
        recent = (await http.get("/health", params={"window_s": 0.2})).json()
        lag = recent["event_loop_lag_ms"]
        assert lag["window_s"] == 0.2
        assert 1 <= lag["samples"] <= 6  # a sample every 50 ms
        assert everything["event_loop_lag_ms"]["samples"] > lag["samples"]
        for bad in ("0", "-1", "601", "soon"):
            response = await http.get("/health", params={"window_s": bad})
            assert response.status_code == 400, bad
            assert response.json()["error"]["code"] == "invalid_message"
        metrics = (await http.get("/metrics")).text
        assert 'va_event_loop_lag_seconds_count{service="tts"}' in metrics
