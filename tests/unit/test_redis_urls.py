"""Bus URLs (plain, Sentinel, Cluster), key names and hash tags, shards."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from services.common.bus.connection import connect, parse_url
from services.common.bus.keys import Keys
from services.common.bus.settings import RedisSettings
from services.common.bus.streams import consumed_shards


def test_plain_urls_stay_plain() -> None:
    assert parse_url("redis://127.0.0.1:6379/0").kind == "plain"
    assert parse_url("rediss://h:6380/2").kind == "plain"
    client = connect(RedisSettings(url="redis://127.0.0.1:6379/0"))
    assert type(client) is Redis


def test_sentinel_url() -> None:
    target = parse_url("redis+sentinel://:secret@h1:26379,h2:26380,h3/mymaster/2")
    assert target.kind == "sentinel" and target.service == "mymaster" and target.db == 2
    assert target.hosts == (("h1", 26379), ("h2", 26380), ("h3", 26379))
    assert target.password == "secret" and not target.tls
    client = connect(RedisSettings(url="redis+sentinel://h1:26379/mymaster/0"))
    assert client.connection_pool.service_name == "mymaster"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="names its master"):
        parse_url("redis+sentinel://h1:26379/")


def test_cluster_url() -> None:
    target = parse_url("redis+cluster://h1:7000,h2:7001/?tls=1")
    assert target.kind == "cluster" and target.hosts == (("h1", 7000), ("h2", 7001))
    assert target.tls
    assert isinstance(connect(RedisSettings(url="redis+cluster://h1:7000/")), RedisCluster)
    with pytest.raises(ValueError, match="database 0"):
        parse_url("redis+cluster://h1:7000/3")
    with pytest.raises(ValueError, match="scheme"):
        parse_url("memcached://h1:11211")


def test_one_shard_keeps_the_historical_names() -> None:
    keys = Keys("va")
    assert keys.jobs("asr") == "va:asr:jobs"
    assert keys.jobs("asr", "partial") == "va:asr:jobs:partial"
    assert keys.job_shards("tts") == ["va:tts:jobs"]
    assert keys.results("gw-1") == "va:gw:gw-1:results"
    assert keys.session("s1") == "va:session:s1"


def test_shards_spread_over_three_equal_slot_ranges() -> None:
    keys = Keys("va", shards=3)
    for service, lane in (("asr", "final"), ("asr", "partial"), ("tts", "final")):
        streams = keys.job_shards(service, lane)
        ranges = [key_slot(s.encode()) * 3 // 16384 for s in streams]
        assert ranges == [0, 1, 2], streams
        # a shard's dead-letter stream shares its slot (same hash tag)
        assert all(key_slot(f"{s}:dead".encode()) == key_slot(s.encode()) for s in streams)
    tag = keys.job_shards("asr")[1].split("{")[1]
    assert Keys("other", shards=3).job_shards("asr")[1].split("{")[1] == tag
    results = keys.results("gw-1")
    assert "{gw-1}" in results
    assert {keys.shard_of(f"sess_{i}") for i in range(100)} == {0, 1, 2}
    assert keys.shard_of("sess_x") == Keys("va", shards=3).shard_of("sess_x")  # stable


def test_consumed_shards() -> None:
    assert consumed_shards(RedisSettings(shards=4)) == [0, 1, 2, 3]
    assert consumed_shards(RedisSettings(shards=4, consume_shards=[3, 1, 1])) == [1, 3]
    with pytest.raises(ValueError, match="names no shard"):
        consumed_shards(RedisSettings(shards=2, consume_shards=[5]))
