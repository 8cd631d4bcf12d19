"""Sessions kept in Redis for resume: round trip, expiry, and Redis out of reach."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from redis.asyncio import Redis

from services.common.bus.connection import connect
from services.common.errors import Forbidden
from services.common.protocol.events import SessionConfig
from services.gateway.agent import Turn
from services.gateway.store import SessionStore, StoredSession
from services.ops.redis_server import free_port, start_redis
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
        assert loaded == (config.model_copy(update={"resumed": None}), history)
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
        await store.save(SessionConfig(id="sess_oom"), [Turn("user", "hi")], "acme")
        assert await store.load("sess_oom", "acme") is None
    finally:
        await redis.aclose()
        proc.kill()
        proc.wait(10)
