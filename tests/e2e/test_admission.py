"""Admission from what the engines serve, end to end: real gateway, ASR and TTS services
(fake engines whose latency the test sets) joined by a real Redis.

The ASR's latency drives voice-to-voice past the budget (a turn cannot be answered before
the ASR has answered, so this holds on any machine); a new session is then refused with
close 1013 and a retry hint while the running one goes on being served; when the engine is
fast again and the slow turn has left the window (the admission's clock is the test's),
sessions are admitted again. `max_sessions` stays the hard cap.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from services.asr.app import create_app as asr_app
from services.asr.engines.fake import FakeAsrEngine
from services.asr.settings import AsrSettings, FakeAsrSettings
from services.client.stream import StreamClient
from services.gateway.admission import Admission, AdmissionSettings
from services.gateway.app import create_app as gateway_app
from services.gateway.settings import GatewaySection, GatewaySettings
from services.tts.app import create_app as tts_app
from services.tts.settings import TtsSettings
from tests.conftest import RedisProc
from tests.e2e.wire import connect, read_to_close
from tests.servers import ServerThread
from tests.speech import speak

BUDGET_MS = 3000.0
SLOW_ASR_MS = 4000.0  # every answer takes longer than the budget, however fast the machine
WINDOW_S = 60.0


class Clock:
    """The admission's clock: it moves when the test says."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Stack:
    gateway: ServerThread
    asr_engine: FakeAsrEngine
    clock: Clock

    @property
    def url(self) -> str:
        return f"{self.gateway.ws}/v1/stream"


@pytest.fixture(scope="module")
def stack(redis_server: RedisProc) -> Iterator[Stack]:
    redis = redis_server.settings()
    engine = FakeAsrEngine(FakeAsrSettings(text="what time is it"))
    clock = Clock()
    settings = AdmissionSettings(v2v_budget_ms=BUDGET_MS, window_s=WINDOW_S, min_turns=1)
    admission = Admission(settings, max_sessions=2, clock=clock)
    section = GatewaySection(end_of_turn="silence", tts_url=None, max_sessions=2)
    gateway = GatewaySettings(profile="fake", redis=redis, gateway=section)
    with (
        ServerThread(asr_app(AsrSettings(profile="fake", redis=redis), engine)),
        ServerThread(tts_app(TtsSettings(profile="fake", redis=redis))),
        ServerThread(gateway_app(gateway, admission=admission)) as server,
    ):
        yield Stack(server, engine, clock)


async def turn(client: StreamClient, text: str) -> float:
    """One spoken turn to its response.done; its voice-to-voice (ms, the client's)."""
    received = client.new_turn()
    await client.speak(speak(text, 16000), 16000)
    done = await client.silence_until("response.done", timeout_s=30)
    assert done["status"] == "completed"
    assert received.voice_to_voice_ms is not None
    return received.voice_to_voice_ms


async def refusal(url: str) -> tuple[list[dict[str, object]], int, str]:
    async with connect(url) as ws:
        events, code = await read_to_close(ws)
        return events, code, ws.close_reason or ""


async def admission_of(stack: Stack) -> dict[str, object]:
    async with httpx.AsyncClient(timeout=10) as http:
        health = (await http.get(f"{stack.gateway.http}/health")).json()
    reading: dict[str, object] = health["admission"]
    return reading


async def test_slow_engines_refuse_newcomers_and_admission_reopens(stack: Stack) -> None:
    async with StreamClient(stack.url) as running:
        stack.asr_engine.settings.latency_ms = SLOW_ASR_MS
        slow = await turn(running, "what time is it")
        assert slow > BUDGET_MS
        reading = await admission_of(stack)
        assert reading["open"] is False and reading["budget_ms"] == BUDGET_MS
        # a newcomer is refused at once: an error event, then 1013 with a retry hint
        events, code, reason = await refusal(stack.url)
        assert code == 1013
        assert [(e["type"], e["code"]) for e in events] == [("error", "capacity")]
        assert events[0]["retry_after_s"] == 10  # the same hint, where a client reads it
        assert reason.startswith("gateway at capacity, retry after 10 s: voice-to-voice p95")
        # the running session is still served
        stack.asr_engine.settings.latency_ms = 0.0
        await turn(running, "and what is the date")
        # load dropped: once the slow turns are out of the window, a fast one opens it
        stack.clock.now += WINDOW_S + 1
        await turn(running, "thank you")
        assert (await admission_of(stack))["open"] is True
        async with StreamClient(stack.url) as second:
            assert second.session["id"]
            # the hard cap: two sessions open, max_sessions 2
            events, code, reason = await refusal(stack.url)
            assert code == 1013 and events[0]["code"] == "capacity"
            assert "VA_GATEWAY__MAX_SESSIONS" in reason
            await second.send({"type": "session.close"})
        await running.send({"type": "session.close"})
