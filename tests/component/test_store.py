"""Sessions kept in Redis for resume: round trip, expiry, and Redis out of reach."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import cast

import pytest
from redis.asyncio import Redis

from services.common.bus.connection import connect
from services.common.errors import Forbidden
from services.common.protocol.events import SessionConfig
from services.gateway.agent import Turn
from services.gateway.store import Resumable, SessionStore, StoredSession, Unheard
from services.ops.redis_server import free_port, start_redis
from tests.component.session_harness import on_virtual_time, running_session, silence, tone
from tests.conftest import RedisProc


async def test_a_saved_session_loads_back(redis_server: RedisProc) -> None:
    settings = redis_server.settings()
    redis = connect(settings)
    store = SessionStore(redis, settings.prefix, ttl_s=60)
    config = SessionConfig(id="sess_a", voice="v", instructions="Be brief.", resumed=True)
    history = [Turn("user", "hi"), Turn("agent", "hello")]
    try:
        await store.save(config, history, "acme")
        assert 0 < await redis.ttl(store.key("sess_a")) <= 60
        loaded = await store.load("sess_a", "acme")
        assert loaded == Resumable(config.model_copy(update={"resumed": None}), history)
        await store.save(config, history[:1], "acme", owed="utt_1")  # its answer is owed
        assert await store.load("sess_a", "acme") == Resumable(
            config.model_copy(update={"resumed": None}), history[:1], "utt_1"
        )
        with pytest.raises(Forbidden):
            await store.load("sess_a", "default")
        assert await store.load("sess_unknown", "acme") is None
        await redis.set(store.key("sess_bad"), b"{not json")
        assert await store.load("sess_bad", "acme") is None  # unreadable: start afresh
        # a record without a tenant is no one's: never resumed as the default tenant's
        untenanted = StoredSession(config=config, history=history, tenant="x").model_dump()
        del untenanted["tenant"]
        await redis.set(store.key("sess_old"), json.dumps(untenanted))
        assert await store.load("sess_old", "default") is None
    finally:
        await redis.aclose()


async def test_redis_out_of_reach_costs_only_the_resume() -> None:
    redis = Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=1)
    store = SessionStore(redis, "down", ttl_s=60)
    try:
        await store.save(SessionConfig(id="sess_a"), [Turn("user", "hi")], "t")  # logged
        assert await store.load("sess_a", "t") is None
    finally:
        await redis.aclose()


async def test_a_redis_refusing_writes_costs_only_the_resume(tmp_path: Path) -> None:
    """A Redis out of memory answers OOM (not an outage): the session goes on unsaved."""
    port = free_port()
    proc = start_redis(port, tmp_path)
    redis = Redis(port=port)
    store = SessionStore(redis, "t", ttl_s=60)
    try:
        await redis.config_set("maxmemory", 1)  # below what it uses: every write refused
        await redis.config_set("maxmemory-policy", "noeviction")
        # refused, logged, and the session goes on (True: not "claimed elsewhere")
        assert await store.save(SessionConfig(id="sess_oom"), [Turn("user", "hi")], "acme")
        assert await store.load("sess_oom", "acme") is None
    finally:
        await redis.aclose()
        proc.kill()
        proc.wait(10)


async def test_a_session_resumed_on_another_gateway_is_written_by_that_one_only(
    redis_server: RedisProc,
) -> None:
    """The client's network changed: it resumed through gateway B while A still held its
    old socket. A's later saves (its last, when the dead socket is found) must not put
    back the history as it was before B's turns."""
    settings = redis_server.settings()
    redis = connect(settings)
    a = SessionStore(redis, settings.prefix, ttl_s=60, owner="gw-a.1")
    b = SessionStore(redis, settings.prefix, ttl_s=60, owner="gw-b.1")
    config = SessionConfig(id="sess_moved")
    before = [Turn("user", "hi"), Turn("agent", "hello")]
    after = [*before, Turn("user", "still there?"), Turn("agent", "yes")]
    try:
        assert await a.save(config, before, "acme")
        loaded = await b.load("sess_moved", "acme")
        assert loaded is not None
        assert await b.claim("sess_moved", "acme", loaded) == Resumable(config, before)
        assert 0 < await redis.ttl(b.key("sess_moved")) <= 60  # the claim kept the TTL
        assert await b.save(config, after, "acme")
        assert not await a.save(config, before, "acme")  # A's stale save: refused
        assert await b.load("sess_moved", "acme") == Resumable(config, after)
        # the client comes back through A: A claims it, and B is the one refused now
        assert await a.claim("sess_moved", "acme", loaded) == Resumable(config, after)
        assert not await b.save(config, after[:1], "acme")
        assert await a.save(config, after, "acme")
        # gone (expired): nothing to claim
        assert await a.claim("sess_gone", "acme", loaded) is None
    finally:
        await redis.aclose()


async def test_a_record_saved_before_owners_is_claimed_and_saved(redis_server: RedisProc) -> None:
    settings = redis_server.settings()
    redis = connect(settings)
    store = SessionStore(redis, settings.prefix, ttl_s=60, owner="gw-new.1")
    config = SessionConfig(id="sess_older")
    history = [Turn("user", "hi")]
    older = StoredSession(config=config, history=history, tenant="acme").model_dump()
    del older["owner"]
    try:
        await redis.set(store.key("sess_older"), json.dumps(older), ex=60)
        loaded = await store.load("sess_older", "acme")
        assert loaded == Resumable(config, history)
        assert await store.claim("sess_older", "acme", loaded) == Resumable(config, history)
        raw = await redis.get(store.key("sess_older"))
        assert json.loads(raw)["owner"] == "gw-new.1"
        assert await store.save(config, [*history, Turn("agent", "hello")], "acme")
        # a record without an owner (saved before owners, or owner "") is anyone's to save
        await redis.set(store.key("sess_older"), json.dumps(older), ex=60)
        other = SessionStore(redis, settings.prefix, ttl_s=60, owner="gw-other.1")
        assert await other.save(config, history, "acme")
    finally:
        await redis.aclose()


class _ClaimedElsewhere:
    """A store whose record another gateway claims once the first turn is saved."""

    def __init__(self) -> None:
        self.saves: list[list[tuple[str, str]]] = []

    async def save(
        self,
        config: SessionConfig,
        history: list[Turn],
        tenant: str,
        owed: str | None = None,
        taken: tuple[str, ...] = (),
    ) -> bool:
        self.saves.append([(t.role, t.text) for t in history])
        return len(self.saves) == 1

    async def note_unheard(self, session_id: str, unheard: Unheard | None) -> None:
        pass  # where an utterance lies: not what these tests look at


@on_virtual_time
async def test_a_session_claimed_on_another_gateway_is_closed_here() -> None:
    store = _ClaimedElsewhere()
    async with running_session(transcripts=["hello there"], store=cast(SessionStore, store)) as h:
        await h.say(silence(200), tone(900), silence(1000))
        async with asyncio.timeout(10):
            while h.socket.closed_with is None:
                await asyncio.sleep(0.01)
    assert h.socket.closed_with == (1000, "resumed on another connection")
    # the user's turn was saved; the reply's record was refused, and the socket closed
    assert store.saves == [
        [("user", "hello there")],
        [("user", "hello there"), ("agent", "hello there")],
    ]
