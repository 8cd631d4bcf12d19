"""A Redis job worker: reads a job stream, runs jobs concurrently, acks them once done.

At-least-once: a job is acknowledged only after its handler returned and its
idempotency mark was set; a crash before that, or Redis out of reach (or refusing for a
while: `out_of_reach`), leaves it pending for XAUTOCLAIM. A handler that raises anything
else (a job it cannot validate, an engine's error on this input, a Redis refusal a retry
would meet again such as WRONGTYPE on its `reply_to`, a bug) would raise it again on every
retry: its job is answered `job.failed` and acknowledged at once (acknowledged even when
the answer itself is refused).

A worker drained to a clean stop deletes its consumer from the group (`JobStream.leave`)
when nothing is pending on it; consumers of workers that died are swept by `reclaim`.

Shutdown (`drain`): the worker stops taking jobs, lets those in flight finish for a
while, and cancels the rest when its `run` is cancelled. A cancelled job is neither
acknowledged nor answered: it stays pending, and another worker's XAUTOCLAIM takes it
once it has gone idle (the heartbeat stops touching it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable

from pydantic import ValidationError
from redis.exceptions import ResponseError

from services.common.bus.connection import REDIS_DOWN, REDIS_FAILED, out_of_reach
from services.common.bus.keys import Keys
from services.common.bus.streams import Delivery, JobStream, tell_failed
from services.common.errors import InternalError

log = logging.getLogger(__name__)

Handler = Callable[[Delivery], Awaitable[None]]


def job_id_of(delivery: Delivery) -> str | None:
    """The idempotency key of a job entry, or None if the entry is malformed."""
    try:
        meta = json.loads(delivery.fields[b"meta"])
        job_id = meta["job_id"]
    except (KeyError, ValueError, TypeError):
        return None
    return job_id if isinstance(job_id, str) else None


def _being_cancelled() -> bool:
    """Whether the running task has been asked to stop: a library that turns the
    cancellation of an await into an error of its own must not make a worker retry."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class JobWorker:
    """Runs `handler` for every job of one stream, at most `concurrency` at a time."""

    def __init__(self, jobs: JobStream, keys: Keys, handler: Handler, concurrency: int) -> None:
        self.jobs = jobs
        self.keys = keys
        self.handler = handler
        self.concurrency = concurrency
        self.connected = False
        self.in_flight: set[asyncio.Task[None]] = set()
        self._entries: dict[asyncio.Task[None], bytes] = {}  # in-flight task → its entry
        self._last_reclaim = 0.0
        self._draining = False
        self.stopped_reading = asyncio.Event()
        """Set once a drain has stopped the worker taking jobs (and when it is not running)."""
        self.stopped_reading.set()

    async def run(self) -> None:
        """Serve until cancelled or drained; survives Redis outages by retrying with backoff.

        Drained, it returns once its jobs in flight are done. Cancelled, it cancels them:
        they stay pending for another worker."""
        self.stopped_reading.clear()
        heartbeat = asyncio.create_task(self._heartbeat(), name=f"touch-{self.jobs.stream}")
        try:
            await self._run()
            self.stopped_reading.set()
            if self.in_flight:  # the heartbeat keeps them this worker's meanwhile
                await asyncio.wait(self.in_flight)
            await self.jobs.leave()
        finally:
            self.stopped_reading.set()
            heartbeat.cancel()
            await self._abandon()

    async def _abandon(self) -> None:
        """Cancel the jobs still in flight and wait a little for them to unwind."""
        stragglers = list(self.in_flight)
        if not stragglers:
            return
        for task in stragglers:
            task.cancel()
        log.warning(
            "%d job(s) on %s left pending for another worker", len(stragglers), self.jobs.stream
        )
        _, stuck = await asyncio.wait(stragglers, timeout=2.0)
        for task in stuck:
            log.error("job task %s did not stop when cancelled", task.get_name())

    async def _heartbeat(self) -> None:
        """Every quarter of `claim_idle_ms`, touch the entries of the jobs in flight: only a
        dead worker's jobs go idle long enough to be reclaimed (a live one's loop would have
        to stall three quarters of it)."""
        period = self.jobs.settings.claim_idle_ms / 4000
        while True:
            await asyncio.sleep(period)
            try:
                await self.jobs.touch(list(self._entries.values()))
            except (*REDIS_DOWN, ResponseError) as exc:
                if _being_cancelled():
                    raise asyncio.CancelledError from exc
                log.info("could not touch jobs in flight on %s: %s", self.jobs.stream, exc)

    async def _run(self) -> None:
        backoff = 0.2
        while not self._draining:
            if _being_cancelled():  # an error that stood for the cancellation: stop, not retry
                raise asyncio.CancelledError
            try:
                await self.jobs.ensure_group()
                self.connected = True
                backoff = 0.2
                await self._serve()
            except REDIS_DOWN as exc:
                if self.connected:
                    log.warning("redis unreachable on %s: %s", self.jobs.stream, exc)
                self.connected = False
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            except ResponseError as exc:
                # a promoted replica that never saw the group (lost with the old master), a
                # node refusing while a Cluster failover settles, a Redis still loading its
                # data, or one refusing us (NOAUTH, protected mode: an operator must act):
                # never a reason for the consumer to stop for good while the service says
                # it is ready. Start over after a backoff.
                if "NOGROUP" in str(exc) or "CLUSTERDOWN" in str(exc):
                    log.warning("%s on %s: recreating the group", exc, self.jobs.stream)
                else:
                    log.error("redis refused %s: %s (retrying)", self.jobs.stream, exc)
                self.connected = False
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _serve(self) -> None:
        idle_s = self.jobs.settings.claim_idle_ms / 1000
        while not self._draining:
            if _being_cancelled():  # a cancellation an await swallowed whole
                raise asyncio.CancelledError
            free = self.concurrency - len(self.in_flight)
            if free <= 0:
                await asyncio.wait(self.in_flight, return_when=asyncio.FIRST_COMPLETED)
                continue
            if time.monotonic() - self._last_reclaim > idle_s / 2:
                self._last_reclaim = time.monotonic()
                running = frozenset(self._entries.values())
                for delivery in await self.jobs.reclaim(free, running):
                    self._spawn(delivery)
                continue
            for delivery in await self.jobs.read(free):
                self._spawn(delivery)

    def _spawn(self, delivery: Delivery) -> None:
        task = asyncio.create_task(self._run_one(delivery), name=f"job-{delivery.entry_id!r}")
        self.in_flight.add(task)
        self._entries[task] = delivery.entry_id
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.in_flight.discard(task)
        self._entries.pop(task, None)

    async def _run_one(self, delivery: Delivery) -> None:
        job_id = job_id_of(delivery)
        try:
            if job_id is None:
                log.error("malformed job %r on %s: dropped", delivery.entry_id, self.jobs.stream)
            elif await self.jobs.is_done(job_id, self.keys):
                log.info("job %s already done: skipped", job_id)
            else:
                await self.handler(delivery)
                await self.jobs.mark_done(job_id, self.keys)
            await self.jobs.ack(delivery.entry_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if _being_cancelled():
                raise asyncio.CancelledError from exc
            if out_of_reach(exc):
                # Left pending: XAUTOCLAIM retries it, and dead-letters it after max_deliveries.
                log.exception("job %s on %s failed: left pending", job_id, self.jobs.stream)
                return
            log.exception("job %s on %s failed: answered as failed", job_id, self.jobs.stream)
            await self._fail(delivery, job_id, exc)

    async def _fail(self, delivery: Delivery, job_id: str | None, exc: Exception) -> None:
        """Tell the owner of a job its handler could not run, then acknowledge it."""
        if isinstance(exc, ValidationError):
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            code, message = "invalid_message", f"malformed job: {where}: {first['msg']}"
        else:
            internal = InternalError.of(exc)
            code, message = internal.code, internal.message
        try:
            await tell_failed(self.jobs.redis, self.jobs.settings, delivery.fields, code, message)
        except REDIS_FAILED as refused:
            if out_of_reach(refused):  # left pending: a retry fails it again
                log.warning(
                    "job %s on %s: could not answer its failure: %s",
                    job_id,
                    self.jobs.stream,
                    refused,
                )
                return
            # refused for good (its reply_to names a key of another type): settled anyway,
            # or the job would come back forever
            log.error(
                "job %s on %s: its failure cannot be told: %s", job_id, self.jobs.stream, refused
            )
        await self._settle(delivery, job_id)

    async def _settle(self, delivery: Delivery, job_id: str | None) -> None:
        """Mark a job done and acknowledge it, whatever its owner was told."""
        try:
            if job_id is not None:
                await self.jobs.mark_done(job_id, self.keys)
            await self.jobs.ack(delivery.entry_id)
        except REDIS_FAILED as exc:
            log.warning("job %s on %s: left pending: %s", job_id, self.jobs.stream, exc)

    async def drain(self, timeout_s: float) -> None:
        """Shutdown: take no more jobs, and wait up to `timeout_s` for those in flight.

        The reader stops at its next turn (a blocking read ends within `block_ms`; the
        jobs it brings are run too). Jobs still running after `timeout_s` are cancelled
        when `run` is, and left pending."""
        self._draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                await self.stopped_reading.wait()
        except TimeoutError:
            log.warning("the reader of %s did not stop in %.0f s", self.jobs.stream, timeout_s)
            return
        left = deadline - loop.time()
        if self.in_flight and left > 0:
            await asyncio.wait(self.in_flight, timeout=left)
