"""A gateway killed mid-conversation (kill -9, no goodbye save) with auth on: its sessions
stay their tenant's. Only the owner's credential resumes one, history included; a key of
any other tenant (the one named `default` above all) is refused before the upgrade.

The saves a crash leaves behind are the ones made during the conversation (each turn's),
so every save must carry the tenant the session was built with (issue 22: they used to
store `default`, which then resumed another tenant's session), and the answer its last
turn is owed: a gateway killed while answering leaves it to the next connection."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from services.asr.app import create_app as asr_app
from services.asr.settings import AsrSettings
from services.common.bus.settings import RedisSettings
from services.gateway.store import StoredSession
from services.ops.cli import wait_ready
from services.ops.redis_server import free_port
from services.tts.app import create_app as tts_app
from services.tts.settings import TtsSettings
from tests.conftest import RedisProc
from tests.e2e.test_auth import AUTH, SECRET, bearer, new_key, refused_handshake, session
from tests.servers import ServerThread


class Gateway:
    """A gateway process of its own (so that it can be killed), on a fixed port."""

    def __init__(self, redis: RedisSettings, port: int, log: Path) -> None:
        self.port = port
        self.env = {
            **os.environ,
            "VA_PROFILE": "fake",
            "VA_REDIS__URL": redis.url,
            "VA_REDIS__PREFIX": redis.prefix,
            "VA_AUTH__REQUIRED": "true",
            "VA_AUTH__TOKEN_SECRET": SECRET,
            "VA_AUTH__LIMITS__SESSIONS_PER_MINUTE": "10000",
        }
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "services.gateway.server", "--port", str(self.port)],
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        wait_ready({"gateway": f"http://127.0.0.1:{self.port}"}, [self.proc], 180, str(self.log))

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()  # SIGKILL: no shutdown, no save when the connection ends
        self.proc.wait(10)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/stream"


@pytest.fixture
def engines(redis_server: RedisProc) -> Iterator[RedisSettings]:
    redis = redis_server.settings()
    common = {"profile": "fake", "redis": redis, "auth": AUTH}
    with ServerThread(asr_app(AsrSettings(**common))), ServerThread(tts_app(TtsSettings(**common))):
        yield redis


async def stored(redis: RedisSettings, session_id: str) -> StoredSession:
    client = Redis.from_url(redis.url)
    try:
        raw = await client.get(f"{redis.prefix}:session:{session_id}")
    finally:
        await client.aclose()
    assert raw is not None
    return StoredSession.model_validate_json(raw)


@pytest.mark.timeout(600)  # two gateway processes start: slow on a busy machine, not wrong
async def test_a_crashed_gateways_session_resumes_for_its_tenant_only(
    engines: RedisSettings, tmp_path: Path
) -> None:
    _, acme = await new_key(engines, "acme")
    _, other = await new_key(engines, "default")
    gateway = Gateway(engines, free_port(), tmp_path / "gateway.log")
    gateway.start()
    try:
        async with session(gateway.url, additional_headers=bearer(acme)) as (ws, created):
            session_id = created["session"]["id"]
            await ws.send(json.dumps({"type": "conversation.text", "text": "Remember the door."}))
            while json.loads(await asyncio.wait_for(_text(ws), 60))["type"] != "response.done":
                pass
            gateway.kill()  # mid-conversation: the socket is still open
        saved = await stored(engines, session_id)
        assert saved.tenant == "acme"  # every save carries it, not only the goodbye one
        assert [t.text for t in saved.history] == ["Remember the door.", "Remember the door."]
        assert saved.owed is None  # answered: nothing to give again on resume
        gateway.start()  # a new process (another gateway id) takes the reconnect
        resume = f"{gateway.url}?session_id={session_id}"
        status, body = await refused_handshake(resume, additional_headers=bearer(other))
        assert (status, body["error"]["code"]) == (403, "forbidden")
        async with session(resume, additional_headers=bearer(acme)) as (_, resumed):
            assert resumed["session"]["id"] == session_id
            assert resumed["session"]["resumed"] is True
    finally:
        if gateway.proc is not None and gateway.proc.poll() is None:
            gateway.proc.terminate()
            gateway.proc.wait(30)


LONG = (
    "Remember to lock the back door, feed the cat, water the plants on the balcony and "
    "call the plumber about the kitchen sink before Friday."
)
"""Its echo lasts seconds (the fake TTS: 300 ms a word): a kill at its `response.created`
lands long before its end, when the answer is recorded."""


@pytest.mark.timeout(600)
async def test_a_turn_whose_gateway_died_while_answering_is_answered_on_resume(
    engines: RedisSettings, tmp_path: Path
) -> None:
    _, acme = await new_key(engines, "acme")
    gateway = Gateway(engines, free_port(), tmp_path / "gateway.log")
    gateway.start()
    try:
        async with session(gateway.url, additional_headers=bearer(acme)) as (ws, created):
            session_id = created["session"]["id"]
            await ws.send(json.dumps({"type": "conversation.text", "text": LONG}))
            while json.loads(await asyncio.wait_for(_text(ws), 60))["type"] != "response.created":
                pass
            gateway.kill()  # answering: its answer dies with it
        saved = await stored(engines, session_id)
        assert [t.text for t in saved.history] == [LONG]
        assert saved.owed == ""  # typed text: owed, with no utterance
        gateway.start()
        resume = f"{gateway.url}?session_id={session_id}"
        async with session(resume, additional_headers=bearer(acme)) as (ws, resumed):
            assert resumed["session"]["resumed"] is True
            events = []
            while not events or events[-1]["type"] != "response.done":
                events.append(json.loads(await asyncio.wait_for(_text(ws), 60)))
        assert events[0]["type"] == "response.created"  # first, unasked
        assert (events[-1]["status"], events[-1]["text"]) == ("completed", LONG)
        saved = await stored(engines, session_id)
        assert [t.role for t in saved.history] == ["user", "agent"]
        assert saved.owed is None
    finally:
        if gateway.proc is not None and gateway.proc.poll() is None:
            gateway.proc.terminate()
            gateway.proc.wait(30)


async def _text(ws: object) -> str:
    """The next text frame (agent audio frames skipped)."""
    while True:
        frame = await ws.recv()  # type: ignore[attr-defined]
        if isinstance(frame, str):
            return frame
