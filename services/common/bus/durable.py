"""Writes whose loss would lose a user's turn: one round trip, then `WAIT` for replicas.

With `wait_replicas` set, a final ASR job, a job's last result and the saved session are on
that many replicas before the write returns, so a failover right after cannot lose them.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, cast

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from services.common.bus.connection import is_cluster
from services.common.bus.settings import RedisSettings

log = logging.getLogger(__name__)

Fields = dict[bytes, bytes]
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
    if time.monotonic() < short_until.get(node, 0.0):
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
        short_until[node] = time.monotonic() + SHORT_RETRY_S
        _check_wait(settings, key, replies[-1])
    return replies[:-1]


SHORT_RETRY_S = 5.0
short_until: dict[str, float] = {}
"""master -> until when its WAITs are skipped (one timed out: see SHORT_RETRY_S)."""


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


def xadd_command(stream: str, fields: Fields, maxlen: int) -> Command:
    flat = [part for pair in fields.items() for part in pair]
    return ("XADD", stream, "MAXLEN", "~", maxlen, "*", *flat)
