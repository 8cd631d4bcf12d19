"""Reaching Redis: bus URLs (plain, Sentinel, Cluster) and a client that rides out failovers.

`redis+sentinel://` URLs go through redis-py's Sentinel (the master is re-resolved on every
reconnect), `redis+cluster://` URLs through RedisCluster (docs/redis-ha.md). The client's
socket timeout exceeds the blocking reads' BLOCK. `REDIS_DOWN` is what "Redis is out of
reach, or a failover is under way" looks like to a caller.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import parse_qs, unquote, urlparse

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import (
    Sentinel,
    SentinelManagedConnection,
    SentinelManagedSSLConnection,
)
from redis.backoff import ExponentialBackoff
from redis.exceptions import (
    ClusterDownError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from services.common.bus.settings import RedisSettings
from services.common.redact import redact_url


class NoReplicasError(ResponseError):
    """`NOREPLICAS`: a master set to `min-replicas-to-write` refused a write because too few
    of its replicas are in reach: one is down or being promoted, or this master has been
    cut off from them (the old master of a split brain, whose writes would be lost).
    Retried as a failover is, then Redis is out of reach (redis-py has no class for it)."""


REDIS_DOWN = (
    RedisConnectionError,
    RedisTimeoutError,
    ClusterDownError,
    OutOfMemoryError,
    TryAgainError,
    ReadOnlyError,
    NoReplicasError,
    OSError,
)
"""Redis out of reach, or a failover under way (a demoted master, a cluster settling, a
master refusing writes it could not replicate)."""
REDIS_FAILED = (RedisError, OSError)
"""Redis out of reach (REDIS_DOWN) or refusing what it was asked (OOM, NOAUTH, a wrong
type): what a caller that can go on without the write catches."""
PASSING_REFUSALS = ("UNBLOCKED", "MASTERDOWN", "LOADING", "BUSY ", "NOGROUP")
"""Refusals that pass by themselves, by their text: a blocked read cut off by a demotion
(REPLICAOF, a planned CLUSTER FAILOVER), a replica cut off from its master, data still
loading, a script running, a group lost with a failed-over master (recreated by the
workers). Memory full is `OutOfMemoryError`, in `REDIS_DOWN`."""
_RETRIED = (RedisConnectionError, RedisTimeoutError, ReadOnlyError, NoReplicasError)
"""What a command is retried on (with backoff) before the error reaches the caller."""

SENTINEL_SCHEME = "redis+sentinel"
CLUSTER_SCHEME = "redis+cluster"


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
        raise ValueError("not a Redis URL (no scheme://): give redis://host:port/db")
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
        raise ValueError(f"no hosts in {redact_url(url)!r}")
    user, _, password = auth.partition(":") if auth else ("", "", "")
    parts = [p for p in path.split("/") if p]
    options = parse_qs(query)
    tls = options.get("tls", ["0"])[0] in ("1", "true", "yes")
    if scheme == SENTINEL_SCHEME:
        if not parts:
            raise ValueError(f"a sentinel URL names its master: {redact_url(url)!r}")
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
    raises RuntimeError/AttributeError/TypeError there (redis/redis-py#4287). And a
    `NOREPLICAS` refusal into `NoReplicasError`, which they cover too."""

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        try:
            await super().send_packed_command(command, check_health)
        except (RuntimeError, AttributeError, TypeError) as exc:
            with contextlib.suppress(Exception):
                await self.disconnect(nowait=True)
            raise RedisConnectionError(f"connection lost while writing: {exc!r}") from exc

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)
        except ResponseError as exc:
            if str(exc).startswith("NOREPLICAS"):
                raise NoReplicasError(str(exc)) from None
            raise


class _WriteGuardSSL(_WriteGuard, SSLConnection):
    pass


class _WriteGuardUnix(_WriteGuard, UnixDomainSocketConnection):
    pass


_GUARDED: dict[type[AbstractConnection], type[AbstractConnection]] = {
    Connection: _WriteGuard,
    SSLConnection: _WriteGuardSSL,
    UnixDomainSocketConnection: _WriteGuardUnix,
}
"""The guarded class of each connection class a plain URL can name."""


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


def out_of_reach(exc: BaseException) -> bool:
    """Whether a retry of what raised `exc` can succeed: Redis out of reach (`REDIS_DOWN`)
    or a refusal that passes by itself (`PASSING_REFUSALS`). Any other refusal (WRONGTYPE,
    a bad argument) would meet the same answer again: not a reason to retry."""
    if isinstance(exc, REDIS_DOWN):
        return True
    if not isinstance(exc, ResponseError):
        return False
    reply = str(exc)
    _, piped, error = reply.partition(" of pipeline caused error: ")  # a pipeline's wording
    return (error.strip("('\"") if piped else reply).startswith(PASSING_REFUSALS)


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
        plain = Redis.from_url(
            settings.url,
            retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=3),
            retry_on_error=[RedisConnectionError, RedisTimeoutError, NoReplicasError],
            socket_timeout=timeout,
            socket_connect_timeout=5.0,
            health_check_interval=30,
            decode_responses=False,
        )
        pool = plain.connection_pool  # its class follows the URL's scheme: guard that one
        pool.connection_class = _GUARDED.get(pool.connection_class, pool.connection_class)
        return plain
    retry = Retry(
        ExponentialBackoff(cap=0.5, base=0.05),
        retries=settings.failover_retries,
        supported_errors=_RETRIED,
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
            retry_on_error=list(_RETRIED),
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
