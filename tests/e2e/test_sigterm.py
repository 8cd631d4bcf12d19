"""SIGTERM on a gateway process (`systemctl stop`) drains it: new sessions are refused, the
turns in flight finish (an answer playing, an utterance waiting for its transcript, a user
still speaking), then each session is saved and closed with 1012 — never 1006 — and
resumes on the next gateway with its whole history.

The gateway is a real process (a thread cannot be sent a signal); the fake ASR and TTS
run in this process. Three spoken sessions at the signal:
- A hears its answer (4 s of audio, 0.4 s a word);
- C has just stopped speaking: its transcript is on its way (the ASR takes 0.6 s);
- B is in the middle of an utterance, and goes on speaking after the signal.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import websockets

from services.asr.app import create_app as asr_app
from services.asr.settings import AsrSection, AsrSettings, FakeAsrSettings
from services.client.stream import Received, StreamClient
from services.common.bus.connection import connect
from services.common.bus.settings import RedisSettings
from services.common.tenancy import DEFAULT_TENANT
from services.gateway.store import SessionStore
from services.tts.app import create_app as tts_app
from services.tts.settings import FakeTtsSettings, TtsSection, TtsSettings
from tests.conftest import RedisProc
from tests.processes import ServiceProcess
from tests.servers import ServerThread
from tests.speech import speak

HEARD = "please tell me a story about the sea and the ships"  # every utterance, 10 words
MS_PER_WORD = 400
ANSWER_BYTES = len(HEARD.split()) * MS_PER_WORD * 24 * 2  # PCM16 at 24 kHz
SHORT = "what is the weather like today"
LONG = "the quick brown fox jumps over the lazy dog by the river bank"


@dataclass
class Gateway:
    process: ServiceProcess
    redis: RedisSettings

    @property
    def url(self) -> str:
        return f"{self.process.ws}/v1/stream"


@pytest.fixture
def gateway(redis_server: RedisProc, tmp_path: Path) -> Iterator[Gateway]:
    redis = redis_server.settings()
    heard = FakeAsrSettings(text=HEARD, latency_ms=600)
    asr = AsrSettings(profile="fake", redis=redis, asr=AsrSection(fake=heard))
    tts = TtsSettings(
        profile="fake", redis=redis, tts=TtsSection(fake=FakeTtsSettings(ms_per_word=MS_PER_WORD))
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "HF_HUB_OFFLINE": "1",
        "VA_PROFILE": "fake",
        "VA_REDIS__URL": redis.url,
        "VA_REDIS__PREFIX": redis.prefix,
        "VA_AUTH__REQUIRED": "false",
        "VA_GATEWAY__END_OF_TURN": "silence",
        "VA_GATEWAY__ADMISSION__ENABLED": "false",  # a busy machine is not load
        "VA_GATEWAY__SERVER__DRAIN_TIMEOUT_S": "20",
    }
    process = ServiceProcess("gateway", env, tmp_path)
    with ServerThread(asr_app(asr)), ServerThread(tts_app(tts)):
        process.start()
        try:
            yield Gateway(process, redis)
        finally:
            process.stop()


@dataclass
class Talker:
    """One spoken session: speaks once, then streams silence (a live microphone) until the
    server closes the connection."""

    url: str
    text: str
    marks: dict[str, asyncio.Event] = field(default_factory=dict)
    turn: Received = field(default_factory=Received)
    session_id: str = ""
    close_code: int | None = None

    def mark(self, name: str) -> asyncio.Event:
        return self.marks.setdefault(name, asyncio.Event())

    def _seen(self, _: float, message: dict[str, Any] | bytes) -> None:
        name = "audio" if isinstance(message, bytes) else str(message.get("type"))
        self.mark(name).set()

    async def run(self) -> None:
        client = StreamClient(self.url, on_message=self._seen)
        async with client:
            self.session_id = client.session["id"]
            self.turn = client.new_turn()
            with contextlib.suppress(websockets.ConnectionClosed):
                await client.speak(speak(self.text, 16000), 16000)
                await client.silence_while(lambda: not client.closed.is_set(), 60)
            await asyncio.wait_for(client.closed.wait(), 60)
            self.close_code = client.close_code


async def refused(url: str) -> bool:
    """Whether a new session is turned away: no connection, or an error and close 1013 (a
    session that came in before the signal was handled is closed 1012: False)."""
    try:
        async with websockets.connect(url, open_timeout=5) as ws:
            await ws.recv()  # the capacity error
            await ws.recv()
    except websockets.ConnectionClosed as closed:
        return closed.rcvd is not None and closed.rcvd.code == 1013
    except OSError:
        return True
    return False


async def test_sigterm_lets_the_turns_in_flight_finish_then_closes_1012(gateway: Gateway) -> None:
    a, b, c = (Talker(gateway.url, text) for text in (SHORT, LONG, SHORT))
    tasks = [asyncio.create_task(a.run())]
    await asyncio.wait_for(a.mark("audio").wait(), 30)  # A's answer is playing
    tasks += [asyncio.create_task(t.run()) for t in (b, c)]
    await asyncio.wait_for(c.mark("speech.stopped").wait(), 30)
    assert b.mark("speech.started").is_set() and not b.mark("speech.stopped").is_set()
    assert not c.mark("transcript.final").is_set() and not a.mark("response.done").is_set()
    gateway.process.send(signal.SIGTERM)

    async with asyncio.timeout(10):
        while not await refused(gateway.url):
            pass
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    assert gateway.process.wait(30) in (0, -signal.SIGTERM)

    for name, talker in {"A": a, "B": b, "C": c}.items():
        assert talker.close_code == 1012, name  # never 1006
        dones = talker.turn.of_type("response.done")
        assert [d["status"] for d in dones] == ["completed"], name
        assert dones[0]["text"] == HEARD, name
        assert abs(len(talker.turn.audio) - ANSWER_BYTES) <= 24 * 2 * 20, name  # ±20 ms
        assert [t["text"] for t in talker.turn.of_type("transcript.final")] == [HEARD], name
    history = await stored_histories(gateway.redis, [a.session_id, b.session_id, c.session_id])
    assert history == [[("user", HEARD), ("agent", HEARD)]] * 3

    gateway.process.start()  # the next gateway resumes them
    async with StreamClient(f"{gateway.url}?session_id={b.session_id}") as again:
        assert again.session["id"] == b.session_id and again.session["resumed"] is True


async def test_sigterm_closes_a_session_between_turns_at_once(gateway: Gateway) -> None:
    async with StreamClient(gateway.url) as client:
        client.new_turn()
        await client.speak(np.zeros(8000, np.float32), 16000)  # silence: no turn
        gateway.process.send(signal.SIGTERM)
        await asyncio.wait_for(client.closed.wait(), 10)
        assert client.close_code == 1012
    assert gateway.process.wait(10) in (0, -signal.SIGTERM)


async def stored_histories(
    redis: RedisSettings, session_ids: list[str]
) -> list[list[tuple[str, str]]]:
    client = connect(redis)
    try:
        store = SessionStore(client, redis.prefix, 60, redis)
        found = [await store.load(session_id, DEFAULT_TENANT) for session_id in session_ids]
    finally:
        await client.aclose()
    return [[(t.role, t.text) for t in s[1]] if s else [] for s in found]
