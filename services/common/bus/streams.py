"""The Redis bus: job streams with consumer groups, reply streams, cancellation marks.

Semantics (see ARCHITECTURE.md and docs/redis-ha.md):
- a delivered entry stays pending until XACK; a worker that dies leaves it pending and
  `JobStream.reclaim` (XAUTOCLAIM) hands it to a live worker after `claim_idle_ms`, while a
  live worker keeps its entries fresh (`touch`) however long its jobs run;
- a job whose handler fails for a reason a retry would meet again (its own input, a bug)
  is answered `job.failed` and acknowledged, not retried; one delivered more than
  `max_deliveries` times (its worker died on it each time) goes to `<stream>:dead`, and its
  owner is told `job.failed` too; a live worker's own job in flight that went idle (its
  touches lost in a failover) is taken back without spending a delivery, and is never
  started a second time;
- every job carries an idempotency key (`job_id`): a worker skips a job already marked
  done, and consumers of results drop repeats, so a reclaimed job never shows twice;
- streams are trimmed approximately (`MAXLEN ~`) with a generous cap, so trimming
  reaches only long-acknowledged entries;
- the client's socket timeout exceeds BLOCK, and every consumer name is unique; a worker
  that stops cleanly deletes its consumer (`leave`), and `reclaim` deletes those long idle
  with nothing pending, so consumers do not pile up with restarts.

High availability (docs/redis-ha.md): `redis+sentinel://` URLs go through redis-py's
Sentinel (the master is re-resolved on every reconnect), `redis+cluster://` URLs through
RedisCluster; job streams can be sharded (`shards`), each shard under its own hash tag,
and writes whose loss would lose a user's turn are followed by `WAIT` (`wait_replicas`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from services.common.bus.connection import REDIS_FAILED, out_of_reach
from services.common.bus.durable import Fields, durable_write, xadd_command
from services.common.bus.keys import Keys, dead_letter
from services.common.bus.messages import failure_of
from services.common.bus.settings import RedisSettings

log = logging.getLogger(__name__)

STALE_CONSUMER_MS = 3_600_000  # a consumer idle this long with nothing pending is deleted
LEAVE_TIMEOUT_S = 2.0  # how long a stopping worker tries to delete its consumer


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


@dataclass(frozen=True, slots=True)
class Delivery:
    """One job entry handed to this consumer."""

    entry_id: bytes
    fields: Fields


class JobStream:
    """One job stream seen by one consumer (or by a producer, which needs no group)."""

    def __init__(
        self,
        redis: Redis,
        settings: RedisSettings,
        stream: str,
        group: str,
        consumer: str,
        stale_consumer_ms: int = STALE_CONSUMER_MS,
    ) -> None:
        """`stale_consumer_ms`: how long a consumer with nothing pending stays idle before
        `reclaim` deletes it (a live worker's blocking reads keep it at most `block_ms`)."""
        self.redis = redis
        self.settings = settings
        self.stream = stream
        self.group = group
        self.consumer = consumer
        self.dead_stream = dead_letter(stream)
        self.stale_consumer_ms = stale_consumer_ms
        self._claim_cursor = b"0-0"
        self._last_sweep = -math.inf

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
        command = xadd_command(self.stream, fields, self.settings.job_stream_maxlen)
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

    async def reclaim(self, count: int, running: frozenset[bytes] = frozenset()) -> list[Delivery]:
        """Take over jobs left pending by dead consumers; poison jobs go to the dead stream.

        `running`: the entries this consumer has in flight. One of them comes back when its
        touches were lost (acknowledged by a master that died before its replica had them):
        its delivery count is put back (XAUTOCLAIM added one) and it is not returned, so it is
        neither run twice nor dead-lettered while it runs.

        Each claimed entry is handled on its own: a refusal on one (its owner's `reply_to`
        a key of another type) never strands the others, now this consumer's. Redis lost
        midway returns those claimed so far and rewinds the cursor to the rest. Now and then
        (`stale_consumer_ms`) consumers long idle with nothing pending are deleted."""
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
            try:
                if await self._triage(entry_id, fields, running):
                    claimed.append(Delivery(entry_id, fields))
            except REDIS_FAILED as exc:
                if not out_of_reach(exc):
                    log.error("job %s on %s: %s", entry_id.decode(), self.stream, exc)
                    continue
                log.warning("redis lost reclaiming on %s: %s", self.stream, exc)
                self._claim_cursor = entry_id  # the rest is looked at again next time
                break
        if claimed:
            log.warning("reclaimed %d pending job(s) on %s", len(claimed), self.stream)
        await self._sweep()
        return claimed

    async def _triage(self, entry_id: bytes, fields: Fields, running: frozenset[bytes]) -> bool:
        """Settle one entry XAUTOCLAIM gave this consumer; True if it is to be run."""
        if not fields:  # deleted by trimming while pending
            await self.ack(entry_id)
        elif entry_id in running:
            await self._give_back_delivery(entry_id)
        elif await self._times_delivered(entry_id) > self.settings.max_deliveries:
            await self._dead_letter(entry_id, fields)
        else:
            return True
        return False

    async def leave(self) -> None:
        """Delete this consumer from the group, if nothing is pending on it (a worker that
        stopped cleanly): consumers would pile up with every restart otherwise. Best
        effort: Redis out of reach leaves it to another worker's sweep."""
        try:
            async with asyncio.timeout(LEAVE_TIMEOUT_S):
                rows = await self.redis.xpending_range(
                    self.stream, self.group, min="-", max="+", count=1, consumername=self.consumer
                )
                if not rows:
                    await self.redis.xgroup_delconsumer(self.stream, self.group, self.consumer)
        except (*REDIS_FAILED, TimeoutError) as exc:
            log.info("consumer %s of %s not deleted: %s", self.consumer, self.stream, exc)

    async def _sweep(self) -> None:
        """Delete the group's consumers idle for `stale_consumer_ms` with nothing pending (of
        workers that died or were cancelled), at most once per half of that."""
        loop = asyncio.get_running_loop()
        if loop.time() - self._last_sweep < self.stale_consumer_ms / 2000:
            return
        self._last_sweep = loop.time()
        try:
            consumers: Any = await self.redis.xinfo_consumers(self.stream, self.group)
            for consumer in consumers:
                name = bytes(consumer["name"])
                if (
                    consumer["pending"] == 0
                    and consumer["idle"] >= self.stale_consumer_ms
                    and name != self.consumer.encode()
                ):
                    await self.redis.xgroup_delconsumer(self.stream, self.group, name)
                    log.info("stale consumer %s of %s deleted", name.decode(), self.stream)
        except REDIS_FAILED as exc:
            log.info("stale consumers of %s not swept: %s", self.stream, exc)

    async def touch(self, entry_ids: list[bytes]) -> None:
        """Reset the idle time of entries this consumer is still working on (XCLAIM to
        itself, JUSTID: the delivery count stays): a live worker's job is never reclaimed,
        however long it runs, so `claim_idle_ms` can be short and a dead worker's jobs move
        on within seconds."""
        if entry_ids:
            ids: list[Any] = list(entry_ids)
            await self.redis.xclaim(self.stream, self.group, self.consumer, 0, ids, justid=True)

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

    async def _give_back_delivery(self, entry_id: bytes) -> None:
        """Undo the delivery XAUTOCLAIM counted on an entry this consumer still runs (XCLAIM
        to itself with RETRYCOUNT, JUSTID: it also counts as a touch)."""
        times = await self._times_delivered(entry_id)
        ids: list[Any] = [entry_id]
        await self.redis.xclaim(
            self.stream,
            self.group,
            self.consumer,
            0,
            ids,
            retrycount=max(times - 1, 1),
            justid=True,
        )
        log.info("job %s on %s still runs here: kept", entry_id.decode(), self.stream)

    async def _dead_letter(self, entry_id: bytes, fields: Fields) -> None:
        """Copy a job to the dead stream, tell its owner, acknowledge it. The owner refusing
        for good (its `reply_to` a key of another type) does not keep it pending: it would
        be dead-lettered again every round."""
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
        given_up = f"the job failed {self.settings.max_deliveries} times: given up"
        try:
            await tell_failed(self.redis, self.settings, fields, "internal", given_up)
        except REDIS_FAILED as exc:
            if out_of_reach(exc):
                raise
            log.error(
                "job %s on %s: its owner cannot be told: %s", entry_id.decode(), self.stream, exc
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
        xadd_command(stream, fields, settings.result_stream_maxlen),
        ("EXPIRE", stream, settings.job_ttl_s),
    ]
    await durable_write(redis, settings, stream, commands, durable)


async def tell_failed(
    redis: Redis, settings: RedisSettings, fields: Fields, code: str, message: str
) -> None:
    """Publish `job.failed` for the job of these entry fields to its owner's result stream
    (nothing when its meta does not say where that is: the failure then stays in the log)."""
    failure = failure_of(fields.get(b"meta", b""), code, message)
    if failure is not None:
        reply_to, failed = failure
        await publish(redis, settings, reply_to, {b"meta": failed.dump()})


async def cancel(redis: Redis, keys: Keys, settings: RedisSettings, response_id: str) -> None:
    """Mark a response cancelled, for every worker to see between chunks."""
    await redis.set(keys.cancelled(response_id), b"1", ex=settings.job_ttl_s)


async def is_cancelled(redis: Redis, keys: Keys, response_id: str) -> bool:
    """Whether a response has been cancelled."""
    return bool(await redis.exists(keys.cancelled(response_id)))


class CancelWatch:
    """The cancellation marks of one process's running jobs, looked up together: one
    round trip every `poll_s` for all of them (a pipeline of EXISTS, which a cluster client
    splits by node), however many jobs run, instead of a look per job and per chunk.

    `watching(response_id)` gives an event that is set once the response is seen
    cancelled. The lookups run while anything is watched; the last watcher to leave ends
    them at once (a lookup under way is let finish: a Redis command cut off costs its
    connection)."""

    def __init__(self, redis: Redis, keys: Keys, poll_s: float) -> None:
        self.redis = redis
        self.keys = keys
        self.poll_s = poll_s
        self.looks = 0
        """Lookups made (each covers every response watched then)."""
        self._watched: dict[str, tuple[asyncio.Event, int]] = {}
        self._unwatched = asyncio.Event()
        self._poller: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def watching(self, response_id: str) -> Iterator[asyncio.Event]:
        event, holders = self._watched.get(response_id, (asyncio.Event(), 0))
        self._watched[response_id] = (event, holders + 1)
        self._unwatched.clear()
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll(), name="cancel-watch")
        try:
            yield event
        finally:
            event, holders = self._watched[response_id]
            if holders > 1:
                self._watched[response_id] = (event, holders - 1)
            else:
                del self._watched[response_id]
                if not self._watched:
                    self._unwatched.set()

    async def _poll(self) -> None:
        while self._watched:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_s):
                    await self._unwatched.wait()
            watched = [(r, event) for r, (event, _) in self._watched.items() if not event.is_set()]
            if not watched:
                continue
            try:
                async with self.redis.pipeline(transaction=False) as pipe:
                    for response_id, _ in watched:
                        pipe.exists(self.keys.cancelled(response_id))
                    found = await pipe.execute()
            except Exception:  # Redis out of reach: the jobs' own writes fail and say so
                log.debug("looking for cancellations failed", exc_info=True)
                continue
            self.looks += 1
            for (_, event), cancelled in zip(watched, found, strict=True):
                if cancelled:
                    event.set()
