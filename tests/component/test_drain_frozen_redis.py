"""A drain while Redis is frozen (SIGSTOP, as the fault drill's `redis_frozen`): every
session still gets its 1012, the sessions are closed side by side, each save is given up
after `save_wait_s`, and the drain ends within its budget rather than at the process
manager's SIGKILL. With Redis answering, each session is saved before its close."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from services.common.bus.connection import connect
from services.common.bus.settings import RedisSettings
from services.common.protocol.events import SessionConfig
from services.common.service.routes import ServiceState
from services.gateway.agent import Turn
from services.gateway.drain import CLOSE_SERVICE_RESTART, Drainer, stop_budget_s
from services.gateway.store import SessionStore
from services.ops.redis_server import free_port, start_redis
from tests.conftest import RedisProc

SESSIONS = 3
BUDGET_S = 30.0
"""The drain's own bound is 1 s of grace and `SAVE_WAIT_S`; before the fix each save waited
out its socket timeout on each try (24 s a session). Far below `stop_budget_s(20)`."""


class FakeChannel:
    """Closing it ends its session, as `run_session` does when its socket closes."""

    def __init__(self, session_id: str, fleet: Fleet) -> None:
        self.session_id = session_id
        self.fleet = fleet

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.fleet.events.append(("closed", self.session_id, code))
        del self.fleet.sessions[self.session_id]
        self.fleet.drainer.closed()


class FakeSession:
    def __init__(self, session_id: str, fleet: Fleet) -> None:
        self.config = SessionConfig(id=session_id)
        self.history = [Turn("user", "hi"), Turn("agent", "hello")]
        self.channel = FakeChannel(session_id, fleet)


class Fleet:
    """A gateway's open sessions, its store and its drainer."""

    def __init__(self, store: SessionStore, busy: bool) -> None:
        self.store = store
        self.events: list[tuple[str, str, int]] = []
        self.saving = 0
        self.most_saving = 0
        self.sessions = {f"sess_{i}": FakeSession(f"sess_{i}", self) for i in range(SESSIONS)}
        state = ServiceState(service="gateway", redis=store.redis)
        self.drainer = Drainer(self.sessions, state, busy=lambda _: busy, save=self.save)
        self.drainer.opened()

    async def save(self, session: FakeSession) -> None:
        self.saving += 1
        self.most_saving = max(self.most_saving, self.saving)
        try:
            await self.store.save(session.config, session.history, "acme")
            self.events.append(("saved", session.config.id, 0))
        finally:
            self.saving -= 1


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisSettings]:
    """A redis-server of this test's own (it is frozen), stopped afterwards."""
    port = free_port()
    proc = start_redis(port, tmp_path)
    try:
        yield RedisSettings(url=f"redis://127.0.0.1:{port}/0", prefix="frozen")
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait(10)


@pytest.mark.parametrize("busy", [False, True], ids=["between-turns", "mid-turn"])
async def test_a_drain_with_redis_frozen_closes_every_session_with_1012_in_its_budget(
    own_redis: RedisSettings, busy: bool, caplog: pytest.LogCaptureFixture
) -> None:
    redis = connect(own_redis)  # the gateway's own client: socket timeouts and retries
    fleet = Fleet(SessionStore(redis, own_redis.prefix, 300, own_redis), busy)
    assert await redis.ping()  # connected before the freeze
    pid = int((await redis.info("server"))["process_id"])
    os.kill(pid, signal.SIGSTOP)
    try:
        async with asyncio.timeout(BUDGET_S):
            report = await fleet.drainer.drain(grace_s=1.0, wait_s=0.0)
    finally:
        os.kill(pid, signal.SIGCONT)
        await redis.aclose()
    closes = {(sid, code) for kind, sid, code in fleet.events if kind == "closed"}
    assert closes == {(sid, CLOSE_SERVICE_RESTART) for sid in ("sess_0", "sess_1", "sess_2")}
    assert not [event for event in fleet.events if event[0] == "saved"]
    assert fleet.most_saving == SESSIONS  # side by side, not one after the other
    assert report.closed_1012 == SESSIONS
    assert report.closed_mid_turn == (SESSIONS if busy else 0)
    assert report.remaining == 0
    given_up = [r for r in caplog.records if "save given up" in r.getMessage()]
    assert len(given_up) == SESSIONS
    assert all(r.levelno == logging.WARNING for r in given_up)
    assert stop_budget_s(20.0) > BUDGET_S


async def test_with_redis_answering_each_session_is_saved_before_its_close(
    redis_server: RedisProc,
) -> None:
    settings = redis_server.settings()
    redis = connect(settings)
    fleet = Fleet(SessionStore(redis, settings.prefix, 300, settings), busy=False)
    try:
        report = await fleet.drainer.drain(grace_s=5.0, wait_s=1.0)
        for sid in ("sess_0", "sess_1", "sess_2"):
            saved = fleet.events.index(("saved", sid, 0))
            assert fleet.events.index(("closed", sid, CLOSE_SERVICE_RESTART)) > saved
            assert await fleet.store.load(sid, "acme") is not None
        assert report.closed_1012 == SESSIONS and report.remaining == 0
    finally:
        await redis.aclose()


async def test_a_save_that_fails_does_not_stop_the_other_closes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Not a Redis outage (the store logs those): a save that raises costs its session
    the save only."""
    redis = Redis(port=free_port())  # never used
    fleet = Fleet(SessionStore(redis, "t", 60), busy=False)

    async def broken(session: FakeSession) -> None:
        raise RuntimeError("a bug")

    fleet.drainer.save = broken
    try:
        report = await fleet.drainer.drain(grace_s=5.0, wait_s=1.0)
    finally:
        await redis.aclose()
    assert report.closed_1012 == SESSIONS and report.remaining == 0
    assert len([r for r in caplog.records if "could not be saved" in r.getMessage()]) == SESSIONS
