"""A session's record expires a resume window after its close, not after its last save:
while it is open its gateway process pushes the expiry back (`SessionStore.keep_alive`),
never for a record another process has claimed, never bringing back one that is gone.

Time passing is simulated by shortening the record's TTL (EXPIRE) to what it would be
after a long quiet spell, so nothing here depends on the machine's speed."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from services.common.bus.connection import connect
from services.common.protocol.events import SessionConfig
from services.gateway.agent import Turn
from services.gateway.store import Resumable, SessionStore
from services.ops.redis_server import free_port
from tests.conftest import RedisProc

WINDOW_S = 300
QUIET_LEFT_S = 5
"""What is left of the window after the session has been quiet that long."""
HISTORY = [Turn("user", "hi"), Turn("agent", "hello")]


async def test_a_live_session_s_record_is_pushed_back_to_a_whole_window(
    redis_server: RedisProc,
) -> None:
    settings = redis_server.settings()
    redis = connect(settings)
    store = SessionStore(redis, settings.prefix, WINDOW_S, settings, owner="gw-a")
    try:
        await store.save(SessionConfig(id="sess_quiet"), HISTORY, "acme")
        await redis.expire(store.key("sess_quiet"), QUIET_LEFT_S)  # quiet for a long while
        assert await store.refresh(["sess_quiet"]) == 1
        assert await redis.ttl(store.key("sess_quiet")) > QUIET_LEFT_S
        assert await store.load("sess_quiet", "acme") == Resumable(
            SessionConfig(id="sess_quiet"), HISTORY
        )
    finally:
        await redis.aclose()


async def test_a_refresh_leaves_a_claimed_record_alone_and_brings_none_back(
    redis_server: RedisProc,
) -> None:
    settings = redis_server.settings()
    redis = connect(settings)
    old = SessionStore(redis, settings.prefix, WINDOW_S, settings, owner="gw-a")
    new = SessionStore(redis, settings.prefix, WINDOW_S, settings, owner="gw-b")
    key = old.key("sess_moved")
    try:
        await old.save(SessionConfig(id="sess_moved"), HISTORY, "acme")
        loaded = await new.load("sess_moved", "acme")
        assert loaded is not None
        assert await new.claim("sess_moved", "acme", loaded) is not None
        await redis.expire(key, QUIET_LEFT_S)
        assert await old.refresh(["sess_moved"]) == 0  # not its record any more
        assert await redis.ttl(key) <= QUIET_LEFT_S
        assert (await new.load("sess_moved", "acme")) == loaded
        assert await new.refresh(["sess_moved"]) == 1
        assert await redis.ttl(key) > QUIET_LEFT_S
        # a session never saved (or whose record expired) is not brought back
        assert await old.refresh(["sess_gone", "sess_moved"]) == 0
        assert not await redis.exists(old.key("sess_gone"))
    finally:
        await redis.aclose()


async def test_keep_alive_refreshes_the_sessions_open_at_each_round(
    redis_server: RedisProc,
) -> None:
    settings = redis_server.settings()
    redis = connect(settings)
    store = SessionStore(redis, settings.prefix, WINDOW_S, settings, owner="gw-a")
    live: dict[str, object] = {}
    keeping = asyncio.create_task(store.keep_alive(live, every_s=0.01))
    try:
        for sid in ("sess_a", "sess_b"):
            await store.save(SessionConfig(id=sid), HISTORY, "acme")
            await redis.expire(store.key(sid), QUIET_LEFT_S)
            live[sid] = object()  # opened after keep_alive started: read at each round
        async with asyncio.timeout(30):
            while min([await redis.ttl(store.key(sid)) for sid in live]) <= QUIET_LEFT_S:
                await asyncio.sleep(0.01)
    finally:
        keeping.cancel()
        with pytest.raises(asyncio.CancelledError):
            await keeping
        await redis.aclose()


async def test_redis_out_of_reach_costs_a_refresh_nothing_more(
    caplog: pytest.LogCaptureFixture,
) -> None:
    redis = Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=1)
    store = SessionStore(redis, "down", ttl_s=60)
    try:
        assert await store.refresh(["sess_a"]) == 0
        assert await store.refresh([]) == 0
    finally:
        await redis.aclose()
    assert any("could not refresh" in r.getMessage() for r in caplog.records)
