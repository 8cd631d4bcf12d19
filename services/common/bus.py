"""The Redis bus: job streams with consumer groups, reply streams, cancellation marks.

Semantics (see ARCHITECTURE.md):
- a delivered entry stays pending until XACK; a worker that dies leaves it pending and
  `JobStream.reclaim` (XAUTOCLAIM) hands it to a live worker after `claim_idle_ms`;
- an entry delivered more than `max_deliveries` times goes to `<stream>:dead`;
- every job carries an idempotency key (`job_id`): a worker skips a job already marked
  done, and consumers of results drop repeats, so a reclaimed job never shows twice;
- streams are trimmed approximately (`MAXLEN ~`) with a generous cap, so trimming
  reaches only long-acknowledged entries;
- the client's socket timeout exceeds BLOCK, and every consumer name is unique.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from services.common.settings import RedisSettings

log = logging.getLogger(__name__)

Fields = dict[bytes, bytes]


def connect(settings: RedisSettings) -> Redis:
    """A redis-py asyncio client whose socket timeout exceeds the blocking reads.

    A dropped connection (a Redis restart, a failover) is retried a few times with
    backoff before the error reaches the caller.
    """
    timeout = settings.block_ms / 1000 + 5.0
    return Redis.from_url(
        settings.url,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=3),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
        socket_timeout=timeout,
        socket_connect_timeout=5.0,
        health_check_interval=30,
        decode_responses=False,
    )


def unique_consumer_name(service: str) -> str:
    """A consumer name no other process shares: host, pid and a random suffix."""
    return f"{service}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class Keys:
    """Every key name the deployment uses, under one prefix."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def jobs(self, service: str, lane: str = "final") -> str:
        """The job stream of a service (`asr`, `tts`); partial ASR jobs have their own lane."""
        return f"{self.prefix}:{service}:jobs" + ("" if lane == "final" else f":{lane}")

    def results(self, gateway_id: str) -> str:
        """The result stream owned by one gateway process."""
        return f"{self.prefix}:gw:{gateway_id}:results"

    def done(self, job_id: str) -> str:
        """Idempotency mark: the job's results were published."""
        return f"{self.prefix}:done:{job_id}"

    def cancelled(self, response_id: str) -> str:
        """Cancellation mark of a response."""
        return f"{self.prefix}:cancel:{response_id}"


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

    async def submit(self, fields: Fields) -> bytes:
        """Append a job; returns its entry id."""
        entry_id: Any = await self.redis.xadd(
            self.stream,
            fields,  # type: ignore[arg-type]
            maxlen=self.settings.job_stream_maxlen,
            approximate=True,
        )
        return bytes(entry_id)

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


async def publish(redis: Redis, settings: RedisSettings, stream: str, fields: Fields) -> None:
    """Append a result to a gateway's result stream (trimmed; it expires when the owner dies)."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.xadd(stream, fields, maxlen=settings.result_stream_maxlen, approximate=True)  # type: ignore[arg-type]
        pipe.expire(stream, settings.job_ttl_s)
        await pipe.execute()


async def cancel(redis: Redis, keys: Keys, settings: RedisSettings, response_id: str) -> None:
    """Mark a response cancelled, for every worker to see between chunks."""
    await redis.set(keys.cancelled(response_id), b"1", ex=settings.job_ttl_s)


async def is_cancelled(redis: Redis, keys: Keys, response_id: str) -> bool:
    """Whether a response has been cancelled."""
    return bool(await redis.exists(keys.cancelled(response_id)))
