"""The Redis bus: job streams with consumer groups, reply streams, cancellation marks.

Semantics (see ARCHITECTURE.md and docs/redis-ha.md):
- a delivered entry stays pending until XACK; a worker that dies leaves it pending and
  `JobStream.reclaim` (XAUTOCLAIM) hands it to a live worker after `claim_idle_ms`;
- an entry delivered more than `max_deliveries` times goes to `<stream>:dead`;
- every job carries an idempotency key (`job_id`): a worker skips a job already marked
  done, and consumers of results drop repeats, so a reclaimed job never shows twice;
- streams are trimmed approximately (`MAXLEN ~`) with a generous cap, so trimming
  reaches only long-acknowledged entries;
- the client's socket timeout exceeds BLOCK, and every consumer name is unique.

High availability (docs/redis-ha.md): `redis+sentinel://` URLs go through redis-py's
Sentinel (the master is re-resolved on every reconnect), `redis+cluster://` URLs through
RedisCluster; job streams can be sharded (`shards`), each shard under its own hash tag,
and writes whose loss would lose a user's turn are followed by `WAIT` (`wait_replicas`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import uuid
import zlib
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import parse_qs, unquote, urlparse

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import Connection, SSLConnection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import (
    Sentinel,
    SentinelManagedConnection,
    SentinelManagedSSLConnection,
)
from redis.backoff import ExponentialBackoff
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from services.common.settings import RedisSettings

log = logging.getLogger(__name__)

Fields = dict[bytes, bytes]
SENTINEL_SCHEME = "redis+sentinel"
CLUSTER_SCHEME = "redis+cluster"
SLOTS = 16384


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """What a bus URL names: plain Redis, a Sentinel-watched master, or a Cluster."""

    kind: str  # "plain", "sentinel" or "cluster"
    hosts: tuple[tuple[str, int], ...] = ()
    service: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False


def parse_url(url: str) -> RedisTarget:
    """Parse `redis://`, `rediss://`, `redis+sentinel://h1:26379,h2:26379/mymaster/0`
    or `redis+cluster://h1:7000,h2:7001/`; `?tls=1` turns TLS on for the HA forms."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"not a Redis URL: {url!r}")
    if scheme in ("redis", "rediss", "unix"):
        return RedisTarget("plain")
    if scheme not in (SENTINEL_SCHEME, CLUSTER_SCHEME):
        raise ValueError(f"unsupported Redis URL scheme {scheme!r}")
    auth, _, hostpart = rest.rpartition("@") if "@" in rest.split("/", 1)[0] else ("", "", rest)
    netloc, _, pathq = hostpart.partition("/")
    path, _, query = pathq.partition("?")
    hosts: list[tuple[str, int]] = []
    default_port = 26379 if scheme == SENTINEL_SCHEME else 6379
    for item in netloc.split(","):
        if not item:
            continue
        parsed = urlparse(f"//{item}")
        hosts.append((parsed.hostname or "127.0.0.1", parsed.port or default_port))
    if not hosts:
        raise ValueError(f"no hosts in {url!r}")
    user, _, password = auth.partition(":") if auth else ("", "", "")
    parts = [p for p in path.split("/") if p]
    options = parse_qs(query)
    tls = options.get("tls", ["0"])[0] in ("1", "true", "yes")
    if scheme == SENTINEL_SCHEME:
        if not parts:
            raise ValueError(f"a sentinel URL names its master: {url!r}")
        db = int(parts[1]) if len(parts) > 1 else 0
        return RedisTarget(
            "sentinel",
            tuple(hosts),
            parts[0],
            db,
            unquote(user) or None,
            unquote(password) or None,
            tls,
        )
    if parts and parts[0] != "0":
        raise ValueError("Redis Cluster has only database 0")
    return RedisTarget(
        "cluster", tuple(hosts), "", 0, unquote(user) or None, unquote(password) or None, tls
    )


class _WriteGuard(Connection):
    """Turns the transport errors a write on a connection the peer (or a concurrent
    disconnect) closed can raise into `ConnectionError`, which the retries cover; asyncio
    raises RuntimeError/AttributeError/TypeError there (redis/redis-py#4287)."""

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        try:
            await super().send_packed_command(command, check_health)
        except (RuntimeError, AttributeError, TypeError) as exc:
            with contextlib.suppress(Exception):
                await self.disconnect(nowait=True)
            raise RedisConnectionError(f"connection lost while writing: {exc!r}") from exc


class _WriteGuardSSL(_WriteGuard, SSLConnection):
    pass


class _MasterConnection(_WriteGuard, SentinelManagedConnection):
    """A Sentinel-managed connection that asks the sentinels for the master on *every*
    reconnect. redis-py 8.1's own reconnects a dropped connection from inside a command's
    retry (`send_packed_command` -> `connect_check_health`) to the address it had, the
    dead master's, until the retries run out; this asks again each time."""

    async def connect_check_health(
        self, check_health: bool = True, retry_socket_connect: bool = True
    ) -> None:
        if self.is_connected:
            return
        if self.connection_pool.is_master:
            self.host, self.port = await self.connection_pool.get_master_address()
        await super().connect_check_health(check_health, retry_socket_connect=False)


class _MasterSSLConnection(_MasterConnection, SentinelManagedSSLConnection):
    pass


class _SentinelRedis(Redis):
    """The master's client; closing it closes the clients of the sentinels too."""

    sentinel_manager: Sentinel | None = None

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        if self.sentinel_manager is not None:
            for client in self.sentinel_manager.sentinels:
                with contextlib.suppress(Exception):
                    await client.aclose()


def connect(settings: RedisSettings) -> Redis:
    """A redis-py asyncio client whose socket timeout exceeds the blocking reads.

    A dropped connection (a Redis restart, a failover) is retried with backoff before
    the error reaches the caller: a few times for a plain URL, long enough to ride out
    a Sentinel or Cluster failover (`failover_retries`) for the HA URLs. A RedisCluster
    is returned typed as `Redis`: it answers every command the bus uses.
    """
    timeout = settings.block_ms / 1000 + 5.0
    target = parse_url(settings.url)
    if target.kind == "plain":
        return Redis.from_url(
            settings.url,
            retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=3),
            retry_on_error=[RedisConnectionError, RedisTimeoutError],
            socket_timeout=timeout,
            socket_connect_timeout=5.0,
            health_check_interval=30,
            decode_responses=False,
        )
    retry = Retry(
        ExponentialBackoff(cap=0.5, base=0.05),
        retries=settings.failover_retries,
        supported_errors=(RedisConnectionError, RedisTimeoutError, ReadOnlyError),
    )
    common: dict[str, Any] = {
        "username": target.username,
        "password": target.password,
        "socket_timeout": timeout,
        "socket_connect_timeout": 2.0,
        "decode_responses": False,
        "retry": retry,
    }
    if target.tls:
        common["ssl"] = True
    if target.kind == "sentinel":
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            list(target.hosts),
            sentinel_kwargs={
                "socket_timeout": 2.0,
                "socket_connect_timeout": 2.0,
                "password": target.password,
                **({"ssl": True} if target.tls else {}),
            },
        )
        client: _SentinelRedis = sentinel.master_for(
            target.service,
            redis_class=_SentinelRedis,
            db=target.db,
            retry_on_error=[RedisConnectionError, RedisTimeoutError, ReadOnlyError],
            health_check_interval=30,
            connection_class=_MasterSSLConnection if target.tls else _MasterConnection,
            **common,
        )
        client.sentinel_manager = sentinel
        return client
    cluster = RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in target.hosts],
        # with `retry`, the cluster client refreshes its slot map and retries on
        # connection errors (failover_retries times)
        **common,
    )
    # RedisCluster takes no connection_class: set it where its nodes read it
    guard = _WriteGuardSSL if target.tls else _WriteGuard
    cluster.connection_kwargs["connection_class"] = guard
    for node in cluster.startup_nodes:
        node.connection_class = guard
    return cast(Redis, cluster)


def is_cluster(redis: Redis) -> bool:
    return isinstance(redis, RedisCluster)


Command = tuple[Any, ...]


async def durable_write(
    redis: Redis, settings: RedisSettings, key: str, commands: list[Command], durable: bool = True
) -> list[Any]:
    """Run `commands` (all on `key`'s slot) in one round trip; when `durable` and
    `wait_replicas` is set, follow them with `WAIT` on the same connection, so they are on
    that many replicas before this returns. Returns the commands' replies.

    On a Cluster, the WAIT goes on a connection of the key's master taken by hand (a
    cluster pipeline would retry a WAIT aimed at a dead master for as long as its
    retries last); if that fails (a failover under way), the commands go through the
    cluster client's own retries without the WAIT, and a repeat is left to idempotency.
    """
    if not durable or settings.wait_replicas <= 0:
        return await _pipelined(redis, commands)
    node = _master_name(redis, key)
    if time.monotonic() < _short_until.get(node, 0.0):
        # this master had too few replicas a moment ago (one was just promoted, say):
        # a WAIT would only time out on every write; retry it after SHORT_RETRY_S
        return await _pipelined(redis, commands)
    wait: Command = ("WAIT", settings.wait_replicas, settings.wait_timeout_ms)
    if is_cluster(redis):
        try:
            replies = await _on_master(cast(RedisCluster, redis), key, [*commands, wait])
        except (RedisError, OSError, RuntimeError, AttributeError, TypeError) as exc:
            log.info("WAIT on %s skipped (%r): writing through the cluster client", key, exc)
            return await _pipelined(redis, commands)
    else:
        replies = await _pipelined(redis, [*commands, wait])
    if isinstance(replies[-1], int) and replies[-1] < settings.wait_replicas:
        _short_until[node] = time.monotonic() + SHORT_RETRY_S
        _check_wait(settings, key, replies[-1])
    return replies[:-1]


SHORT_RETRY_S = 5.0
_short_until: dict[str, float] = {}  # master -> until when its WAITs are skipped


def _master_name(redis: Redis, key: str) -> str:
    if not is_cluster(redis):
        return "master"
    with contextlib.suppress(Exception):
        node = cast(RedisCluster, redis).get_node_from_key(key)
        if node is not None:
            return str(node.name)
    return "unknown"


async def _pipelined(redis: Redis, commands: list[Command]) -> list[Any]:
    async with redis.pipeline(transaction=False) as pipe:
        for command in commands:
            pipe.execute_command(*command)
        replies: list[Any] = await pipe.execute()
    return replies


async def _on_master(cluster: RedisCluster, key: str, commands: list[Command]) -> list[Any]:
    """One attempt on one connection of the master of `key`'s slot; errors are raised."""
    node = cluster.get_node_from_key(key)
    if node is None:
        raise RedisConnectionError(f"no master known for {key}")
    connection = node.acquire_connection()
    try:
        await connection.send_packed_command(connection.pack_commands(commands))
        replies = [await connection.read_response() for _ in commands]
    except BaseException:
        with contextlib.suppress(Exception):
            await connection.disconnect()
        raise
    finally:
        node.release(connection)
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


_wait_warned = [0.0]  # when a short WAIT was last logged (at most one line every 10 s)


def _check_wait(settings: RedisSettings, key: str, acked: Any) -> None:
    if isinstance(acked, int) and acked < settings.wait_replicas:
        if time.monotonic() - _wait_warned[0] < 10.0:
            return
        _wait_warned[0] = time.monotonic()
        log.warning(
            "WAIT on %s: %d of %d replica(s) acknowledged within %d ms; "
            "writes to this master skip WAIT for the next few seconds",
            key,
            acked,
            settings.wait_replicas,
            settings.wait_timeout_ms,
        )


async def durable_set(
    redis: Redis, settings: RedisSettings, key: str, value: bytes | str, ex: int
) -> None:
    """SET, then WAIT for `wait_replicas` replicas when configured."""
    await durable_write(redis, settings, key, [("SET", key, value, "EX", ex)])


def _xadd(stream: str, fields: Fields, maxlen: int) -> Command:
    flat = [part for pair in fields.items() for part in pair]
    return ("XADD", stream, "MAXLEN", "~", maxlen, "*", *flat)


def consumed_shards(settings: RedisSettings) -> list[int]:
    """The job-stream shards a worker of these settings reads."""
    every = list(range(settings.shards))
    if settings.consume_shards is None:
        return every
    chosen = sorted({s for s in settings.consume_shards if 0 <= s < settings.shards})
    if not chosen:
        raise ValueError(f"consume_shards {settings.consume_shards} names no shard of {every}")
    return chosen


def unique_consumer_name(service: str) -> str:
    """A consumer name no other process shares: host, pid and a random suffix."""
    return f"{service}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _shard_tag(base: str, shard: int, shards: int) -> str:
    """A hash tag for shard `shard` of `shards` whose slot lies in the shard's share of
    the 16384 slots, so that N shards spread evenly over masters holding equal ranges."""
    low, high = shard * SLOTS // shards, (shard + 1) * SLOTS // shards
    for salt in range(100_000):
        tag = f"{base}.{shard}.{salt}"
        if low <= key_slot(tag.encode()) < high:
            return tag
    return f"{base}.{shard}"  # unreachable for shards <= 16384


class Keys:
    """Every key name the deployment uses, under one prefix.

    Hash tags (`{...}`): each job-stream shard has its own tag, and the dead-letter
    stream of a shard shares it; a gateway's result stream is tagged by the gateway id;
    a session by its id. With `shards=1` the names are the historical ones (no tags).
    Keys of different tags are never used in one multi-key command or transaction.
    """

    def __init__(self, prefix: str, shards: int = 1) -> None:
        self.prefix = prefix
        self.shards = shards
        self._tags: dict[tuple[str, int], str] = {}

    def jobs(self, service: str, lane: str = "final", shard: int = 0) -> str:
        """The job stream of a service (`asr`, `tts`) and lane; with shards, of one shard."""
        base = f"{self.prefix}:{service}:jobs" + ("" if lane == "final" else f":{lane}")
        if self.shards <= 1:
            return base
        name = f"{service}.{lane}"
        tag = self._tags.get((name, shard))
        if tag is None:
            tag = self._tags[(name, shard)] = _shard_tag(name, shard, self.shards)
        return f"{base}:{{{tag}}}"

    def job_shards(self, service: str, lane: str = "final") -> list[str]:
        """Every shard of a job stream."""
        return [self.jobs(service, lane, shard) for shard in range(max(1, self.shards))]

    def shard_of(self, routing_key: str) -> int:
        """The shard a session's jobs go to (stable across processes)."""
        return zlib.crc32(routing_key.encode()) % max(1, self.shards)

    def results(self, gateway_id: str) -> str:
        """The result stream owned by one gateway process."""
        if self.shards <= 1:
            return f"{self.prefix}:gw:{gateway_id}:results"
        return f"{self.prefix}:gw:{{{gateway_id}}}:results"

    def done(self, job_id: str) -> str:
        """Idempotency mark: the job's results were published."""
        return f"{self.prefix}:done:{job_id}"

    def cancelled(self, response_id: str) -> str:
        """Cancellation mark of a response."""
        return f"{self.prefix}:cancel:{response_id}"

    def session(self, session_id: str) -> str:
        """A stored session (gateway resume)."""
        return f"{self.prefix}:session:{session_id}"


@dataclass(frozen=True, slots=True)
class Delivery:
    """One job entry handed to this consumer."""

    entry_id: bytes
    fields: Fields


class JobStream:
    """One job stream seen by one consumer (or by a producer, which needs no group)."""

    def __init__(
        self, redis: Redis, settings: RedisSettings, stream: str, group: str, consumer: str
    ) -> None:
        self.redis = redis
        self.settings = settings
        self.stream = stream
        self.group = group
        self.consumer = consumer
        self.dead_stream = f"{stream}:dead"
        self._claim_cursor = b"0-0"

    async def ensure_group(self) -> None:
        """Create the consumer group (and the stream) if missing."""
        try:
            await self.redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def submit(self, fields: Fields, durable: bool = False) -> bytes:
        """Append a job; returns its entry id. `durable`: then WAIT for `wait_replicas`
        replicas (when set), so a failover right after cannot lose an acknowledged job."""
        if not durable or self.settings.wait_replicas <= 0:
            entry_id: Any = await self.redis.xadd(
                self.stream,
                fields,  # type: ignore[arg-type]
                maxlen=self.settings.job_stream_maxlen,
                approximate=True,
            )
            return bytes(entry_id)
        command = _xadd(self.stream, fields, self.settings.job_stream_maxlen)
        replies = await durable_write(self.redis, self.settings, self.stream, [command])
        return bytes(replies[0])

    async def read(self, count: int, block_ms: int | None = None) -> list[Delivery]:
        """New jobs for this consumer, waiting up to `block_ms` for the first."""
        block = self.settings.block_ms if block_ms is None else block_ms
        reply: Any = await self.redis.xreadgroup(
            self.group, self.consumer, {self.stream: ">"}, count=count, block=block
        )
        if not reply:
            return []
        _, entries = reply[0]
        return [Delivery(entry_id, fields) for entry_id, fields in entries if fields]

    async def reclaim(self, count: int) -> list[Delivery]:
        """Take over jobs left pending by dead consumers; poison jobs go to the dead stream."""
        reply: Any = await self.redis.xautoclaim(
            self.stream,
            self.group,
            self.consumer,
            min_idle_time=self.settings.claim_idle_ms,
            start_id=self._claim_cursor,
            count=count,
        )
        cursor, entries = reply[0], reply[1]
        self._claim_cursor = cursor
        claimed: list[Delivery] = []
        for entry_id, fields in entries:
            if not fields:  # deleted by trimming while pending
                await self.ack(entry_id)
            elif await self._times_delivered(entry_id) > self.settings.max_deliveries:
                await self._dead_letter(entry_id, fields)
            else:
                claimed.append(Delivery(entry_id, fields))
        if claimed:
            log.warning("reclaimed %d pending job(s) on %s", len(claimed), self.stream)
        return claimed

    async def ack(self, entry_id: bytes) -> None:
        """Acknowledge one job: it leaves the pending list."""
        await self.redis.xack(self.stream, self.group, entry_id)

    async def is_done(self, job_id: str, keys: Keys) -> bool:
        """Whether a job's results were already published (a reclaimed duplicate)."""
        return bool(await self.redis.exists(keys.done(job_id)))

    async def mark_done(self, job_id: str, keys: Keys) -> None:
        """Record that a job's results are out, then acknowledge happens separately."""
        await self.redis.set(keys.done(job_id), b"1", ex=self.settings.job_ttl_s)

    async def pending_count(self) -> int:
        """Jobs delivered but not yet acknowledged, over all consumers."""
        info = await self.redis.xpending(self.stream, self.group)
        return int(info["pending"])

    async def _times_delivered(self, entry_id: bytes) -> int:
        rows = await self.redis.xpending_range(
            self.stream, self.group, min=entry_id, max=entry_id, count=1
        )
        return int(rows[0]["times_delivered"]) if rows else 0

    async def _dead_letter(self, entry_id: bytes, fields: Fields) -> None:
        log.error(
            "job %s on %s exceeded %d deliveries: dead-lettered",
            entry_id.decode(),
            self.stream,
            self.settings.max_deliveries,
        )
        await self.redis.xadd(
            self.dead_stream,
            {**fields, b"source_id": entry_id},  # type: ignore[dict-item]
            maxlen=self.settings.job_stream_maxlen,
            approximate=True,
        )
        await self.ack(entry_id)


async def publish(
    redis: Redis, settings: RedisSettings, stream: str, fields: Fields, durable: bool = True
) -> None:
    """Append a result to a gateway's result stream (trimmed; it expires when the owner dies).

    `durable`: WAIT for `wait_replicas` replicas when set, so the result is on a replica
    before the next one goes out and before the job is marked done and acknowledged; a
    failover then cannot drop a result while a later one of the same job survives.
    """
    commands = [
        _xadd(stream, fields, settings.result_stream_maxlen),
        ("EXPIRE", stream, settings.job_ttl_s),
    ]
    await durable_write(redis, settings, stream, commands, durable)


async def cancel(redis: Redis, keys: Keys, settings: RedisSettings, response_id: str) -> None:
    """Mark a response cancelled, for every worker to see between chunks."""
    await redis.set(keys.cancelled(response_id), b"1", ex=settings.job_ttl_s)


async def is_cancelled(redis: Redis, keys: Keys, response_id: str) -> bool:
    """Whether a response has been cancelled."""
    return bool(await redis.exists(keys.cancelled(response_id)))
