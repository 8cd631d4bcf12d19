"""A gateway killed -9 after the user stopped speaking and before their transcript came
(a real process; the fake ASR takes 5 s): nothing of the turn was in the session's record
yet, only the note of where its ASR job lies. The session's next connection reads the
audio back, hears it again and answers it; the record then holds the turn once."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.asr.app import create_app as asr_app
from services.asr.settings import AsrSection, AsrSettings, FakeAsrSettings
from services.client.stream import StreamClient
from services.common.bus.connection import connect
from services.common.bus.settings import RedisSettings
from services.common.tenancy import DEFAULT_TENANT
from services.gateway.store import SessionStore, Unheard
from services.tts.app import create_app as tts_app
from services.tts.settings import FakeTtsSettings, TtsSection, TtsSettings
from tests.conftest import RedisProc
from tests.processes import ServiceProcess
from tests.servers import ServerThread
from tests.speech import speak

HEARD = "remember to lock the back door"
ASR_S = 5.0
"""The fake ASR's time per call: the kill lands well inside it."""


@pytest.fixture
def stack(
    redis_server: RedisProc, tmp_path: Path
) -> Iterator[tuple[ServiceProcess, RedisSettings]]:
    redis = redis_server.settings()
    heard = FakeAsrSettings(text=HEARD, latency_ms=ASR_S * 1000)
    asr = AsrSettings(profile="fake", redis=redis, asr=AsrSection(fake=heard))
    tts = TtsSettings(
        profile="fake", redis=redis, tts=TtsSection(fake=FakeTtsSettings(ms_per_word=100))
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
    }
    gateway = ServiceProcess("gateway", env, tmp_path)
    with ServerThread(asr_app(asr)), ServerThread(tts_app(tts)):
        gateway.start()
        try:
            yield gateway, redis
        finally:
            gateway.stop()


async def _note(redis: RedisSettings, session_id: str, within_s: float = 30) -> Unheard:
    """The session's note of its utterance sent for transcription, once written."""
    client = connect(redis)
    store = SessionStore(client, redis.prefix, 60, redis)
    deadline = time.monotonic() + within_s
    try:
        while (note := await store.unheard(session_id)) is None:
            assert time.monotonic() < deadline, "no note of the utterance sent"
            await asyncio.sleep(0.02)
        return note
    finally:
        await client.aclose()


@pytest.mark.timeout(600)  # two gateway starts: slow on a busy machine, not wrong
async def test_an_utterance_whose_gateway_died_before_its_transcript_is_heard_again(
    stack: tuple[ServiceProcess, RedisSettings],
) -> None:
    gateway, redis = stack
    url = f"{gateway.ws}/v1/stream"
    async with StreamClient(url) as client:
        session_id = client.session["id"]
        turn = client.new_turn()
        await client.speak(speak(HEARD, 16000), 16000)
        noting = asyncio.create_task(_note(redis, session_id))
        await client.silence_while(lambda: not noting.done(), 30)  # a live microphone
        note = await noting
        gateway.send(signal.SIGKILL)  # its ASR job is still being transcribed
        gateway.wait(10)
        assert turn.of_type("transcript.final") == []  # the precondition: nothing was taken
        started = turn.of_type("speech.started")[0]["utterance_id"]
    assert note.utterance_id == started
    gateway.start()
    async with StreamClient(f"{url}?session_id={session_id}") as again:
        assert again.session["resumed"] is True
        heard = again.received  # since session.created: the words heard again come unasked
        done = await again.silence_until("response.done", ASR_S + 60)
    finals = heard.of_type("transcript.final")
    assert [(f["utterance_id"], f["text"]) for f in finals] == [(started, HEARD)]
    assert [c["utterance_id"] for c in heard.of_type("response.created")] == [started]
    assert (done["status"], done["text"]) == ("completed", HEARD)
    client_ = connect(redis)
    try:
        stored = await SessionStore(client_, redis.prefix, 60, redis).load(
            session_id, DEFAULT_TENANT
        )
    finally:
        await client_.aclose()
    assert stored is not None
    assert [(t.role, t.text) for t in stored.history] == [("user", HEARD), ("agent", HEARD)]
    assert stored.taken == (started,) and stored.owed is None
