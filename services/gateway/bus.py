"""The gateway's side of the Redis bus: submit jobs, receive results on its own stream.

The jobs a turn needs (a final transcript, a reply's speech) are kept here until their
result comes, for as long as the session waits for it: a Redis that lost them (restarted
without persistence, a replica promoted without them) gets them again, so an answer in
flight when Redis went down is still given (docs/fault-drill.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from services.common.bus.connection import REDIS_DOWN, REDIS_FAILED
from services.common.bus.durable import Fields
from services.common.bus.keys import Keys
from services.common.bus.messages import (
    RESULTS,
    AsrJob,
    AsrResult,
    BusResult,
    JobFailed,
    TtsDone,
    TtsJob,
)
from services.common.bus.settings import RedisSettings
from services.common.bus.streams import JobStream, cancel
from services.gateway import metrics

log = logging.getLogger(__name__)

Deliver = Callable[[BusResult, bytes | None], None]
Sleep = Callable[[float], Awaitable[None]]
SEEN_RESULTS = 8192  # results remembered to drop repeats (a job replayed after a failover)
RETRY_FIRST_S = 0.25  # the first pause between tries of a turn's job; doubles up to RETRY_MAX_S
RETRY_MAX_S = 2.0
KEEP_S = 120.0
"""How long a turn's job is kept for `resubmit_lost` when neither its result nor its
response's cancel comes (its session ended, say): well past every timeout of a session's."""
LOST_CHECK_S = 2.0
"""At most this long between looks for lost jobs, however busy the result stream: a
failover the client's retries rode out never reaches the reader as an error."""


@dataclass
class _InFlight:
    """A turn's job submitted and not yet answered."""

    stream: JobStream
    fields: Fields
    entry_id: bytes
    """Where it lies in its stream (a Redis that lost it has no such entry)."""
    response_id: str | None
    until: float
    """Clock time after which it is forgotten (`KEEP_S` after it went)."""


@contextlib.asynccontextmanager
async def _unreachable(what: str) -> AsyncIterator[None]:
    """Redis out of reach drops the job (or the cancellation) instead of failing the
    session: the session's own timeouts tell the client (`asr_unavailable` after
    `asr_timeout_s`, `tts_unavailable` after `tts_timeout_s`), and a job's partial or
    speculative transcript was droppable anyway. The fault drill found sessions closed with
    1011 when Redis restarted (docs/fault-drill.md). A job that carries a turn is tried
    again first (`GatewayBus._submit_turn`)."""
    try:
        yield
    except REDIS_DOWN as exc:
        log.warning("redis unreachable: %s dropped (%s)", what, exc)


class GatewayBus:
    """Submits ASR/TTS jobs whose results come back to this gateway's stream."""

    def __init__(
        self,
        redis: Redis,
        settings: RedisSettings,
        gateway_id: str,
        retry_s: float = 0.0,
        sleep: Sleep = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`retry_s`: how long a job that carries a turn (a final transcript, a reply's
        speech) is tried again while Redis is out of reach, before it is dropped; the
        gateway gives it the session's own ASR/TTS timeout, after which the turn is
        reported failed anyway."""
        self.redis = redis
        self.settings = settings
        self.retry_s = retry_s
        self._sleep = sleep
        self._clock = clock
        self.keys = Keys(settings.prefix, settings.shards)
        self.reply_to = self.keys.results(gateway_id)
        self._asr = {
            lane: [
                JobStream(redis, settings, stream, "asr", gateway_id)
                for stream in self.keys.job_shards("asr", lane)
            ]
            for lane in ("final", "partial")
        }
        self._tts = [
            JobStream(redis, settings, stream, "tts", gateway_id)
            for stream in self.keys.job_shards("tts")
        ]
        self._seen: OrderedDict[tuple[str, str, int, int], None] = OrderedDict()
        self._in_flight: dict[str, _InFlight] = {}
        """The turns' jobs by id, until their result (`_answered`) or their response's
        cancel (or `KEEP_S`)."""

    async def submit_asr(self, job: AsrJob, pcm16: bytes) -> tuple[str, bytes] | None:
        """A final transcript is a user's turn: it waits for replicas (`wait_replicas`) and
        is tried again while Redis is out of reach (a partial is dropped at once). Where a
        final one lies (its stream and entry: `job_audio` reads it back); None for a
        partial, or a job dropped."""
        stream = self._asr[job.mode][self.keys.shard_of(job.session_id)]
        fields: Fields = {b"meta": job.dump(), b"audio": pcm16}
        if job.mode == "final":
            entry_id = await self._submit_turn(stream, fields, job.job_id, None)
            return None if entry_id is None else (stream.stream, entry_id)
        async with _unreachable(f"the ASR job {job.job_id}"):
            await stream.submit(fields)
        return None

    async def job_audio(self, stream: str, entry_id: str) -> tuple[AsrJob, bytes] | None:
        """An ASR job submitted earlier (by any gateway process) and its audio, read back
        from its entry; None when the stream no longer holds it, or Redis is out of reach."""
        try:
            entries: Any = await self.redis.xrange(stream, entry_id, entry_id, count=1)
        except REDIS_FAILED as exc:
            log.warning("could not read the ASR job at %s %s: %s", stream, entry_id, exc)
            return None
        if not entries:
            return None
        fields = entries[0][1]
        try:
            return AsrJob.model_validate_json(fields[b"meta"]), bytes(fields[b"audio"])
        except (KeyError, ValidationError):
            log.error("the ASR job at %s %s is unreadable", stream, entry_id)
            return None

    async def submit_tts(self, job: TtsJob) -> None:
        """The spoken answer of a turn: it waits for replicas and is tried again too."""
        stream = self._tts[self.keys.shard_of(job.session_id)]
        await self._submit_turn(stream, {b"meta": job.dump()}, job.job_id, job.response_id)

    async def _submit_turn(
        self, stream: JobStream, fields: Fields, job_id: str, response_id: str | None
    ) -> bytes | None:
        """Submit a job a turn needs, trying again for `retry_s` while Redis is out of reach
        (a failover: the cluster client gives up on a dead master before a replica is
        promoted), and keep it until its result comes (`resubmit_lost`). A try that reached
        Redis before its connection broke may leave the job twice: workers skip a job
        already done and results are de-duplicated by job id. Its entry id (None: dropped)."""
        what = f"the {stream.group.upper()} job {job_id}"
        deadline = self._clock() + self.retry_s
        pause = RETRY_FIRST_S
        while True:
            try:
                entry_id = await stream.submit(fields, durable=True)
                until = self._clock() + KEEP_S
                self._keep(job_id, _InFlight(stream, fields, entry_id, response_id, until))
                return entry_id
            except REDIS_DOWN as exc:
                left = deadline - self._clock()
                if left <= 0:
                    log.warning("redis unreachable: %s dropped (%s)", what, exc)
                    return None
                log.info("redis unreachable: %s tried again (%s)", what, exc)
                await self._sleep(min(pause, left))
                pause = min(pause * 2, RETRY_MAX_S)

    async def cancel(self, response_id: str) -> None:
        for job_id in [j for j, job in self._in_flight.items() if job.response_id == response_id]:
            del self._in_flight[job_id]
        async with _unreachable(f"the cancellation of {response_id}"):
            await cancel(self.redis, self.keys, self.settings, response_id)

    def _keep(self, job_id: str, job: _InFlight) -> None:
        now = self._clock()
        for old in [j for j, kept in self._in_flight.items() if kept.until < now]:
            del self._in_flight[old]  # its session is long over
        self._in_flight[job_id] = job

    def _answered(self, result: BusResult) -> None:
        """A job's last result came: it is no longer kept."""
        final = isinstance(result, TtsDone | JobFailed) or (
            isinstance(result, AsrResult) and result.mode == "final"
        )
        if final:
            self._in_flight.pop(result.job_id, None)

    async def resubmit_lost(self) -> int:
        """Submit again the turns' jobs Redis no longer has (it came back empty, or a replica
        was promoted without them): one pipelined look-up of their entries. How many went
        again. Called by the result reader after an outage or a quiet read."""
        now = self._clock()
        kept = [(j, job) for j, job in self._in_flight.items() if job.until >= now]
        if not kept:
            return 0
        async with self.redis.pipeline(transaction=False) as pipe:
            for _, job in kept:
                pipe.xrange(job.stream.stream, job.entry_id, job.entry_id, count=1)
            found: list[Any] = await pipe.execute()
        missing = [(j, job) for (j, job), entries in zip(kept, found, strict=True) if not entries]
        if not missing:
            return 0
        # an entry trimmed from its stream (`MAXLEN ~` cuts whole nodes) while a worker
        # runs its job is still pending in the workers' group: not lost
        async with self.redis.pipeline(transaction=False) as pipe:
            for _, job in missing:
                pipe.xpending_range(
                    job.stream.stream, job.stream.group, job.entry_id, job.entry_id, 1
                )
            running: list[Any] = await pipe.execute(raise_on_error=False)
        lost = [
            (j, job)
            for (j, job), rows in zip(missing, running, strict=True)
            if not rows or _no_group(rows)
        ]
        for job_id, job in lost:
            log.warning("job %s lost with Redis's data: submitted again", job_id)
            job.entry_id = await job.stream.submit(job.fields, durable=True)
            metrics.JOBS_RESUBMITTED.labels(job.stream.group).inc()
        return len(lost)

    async def route_results(self, deliver: Deliver) -> None:
        """Read this gateway's result stream forever, handing each result to `deliver`.

        Starts from the beginning: `reset` cleared what an earlier process left. Redis out
        of reach, or refusing (a read cut off by a failover answers `UNBLOCKED`), costs a
        backoff, never the reader. After an error or an empty read the cursor is checked
        (`_checked_cursor`)."""
        cursor = b"0-0"
        backoff = 0.2
        suspect = False
        checked = self._clock()
        while True:
            if self._in_flight and (suspect or self._clock() - checked >= LOST_CHECK_S):
                try:
                    await self.resubmit_lost()
                    checked = self._clock()
                except REDIS_FAILED as exc:  # the read below goes on; looked at again next
                    log.warning("looking for lost jobs failed: %s", exc)
            try:
                if suspect:
                    cursor = await self._checked_cursor(cursor)
                reply: Any = await self.redis.xread(
                    {self.reply_to: cursor}, count=256, block=self.settings.block_ms
                )
                backoff = 0.2
            except REDIS_FAILED as exc:
                log.warning("redis unreachable or refusing reading results: %s", exc)
                suspect = True
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            suspect = not reply
            for _, entries in reply or []:
                for entry_id, fields in entries:
                    cursor = entry_id
                    self._dispatch(fields, deliver)

    async def _checked_cursor(self, cursor: bytes) -> bytes:
        """`cursor`, or 0-0 when the stream is gone or was last written below it: a Redis
        that came back without it (a restart without persistence, a promoted replica that
        lacked it) numbers new entries by its own clock, which may be behind, and reading
        after the old cursor would skip every result. Read again from the start, results
        already delivered are dropped as repeats (`_repeat`)."""
        if cursor == b"0-0":
            return cursor
        try:
            info: Any = await self.redis.xinfo_stream(self.reply_to)
        except ResponseError as exc:
            if "no such key" not in str(exc):
                raise
            log.info("result stream %s gone: read from its start", self.reply_to)
            return b"0-0"
        last = bytes(info["last-generated-id"])
        if _entry_order(last) >= _entry_order(cursor):
            return cursor
        log.warning(
            "result stream %s was last written at %s, behind the cursor %s (a Redis that came "
            "back without it): read from its start",
            self.reply_to,
            last.decode(),
            cursor.decode(),
        )
        return b"0-0"

    def _dispatch(self, fields: Fields, deliver: Deliver) -> None:
        try:
            result = RESULTS.validate_json(fields[b"meta"])
        except (KeyError, ValidationError):
            log.error("malformed result dropped: %r", fields.get(b"meta", b"")[:200])
            return
        if self._repeat(result):
            log.info("repeated result of job %s dropped", result.job_id)
            return
        self._answered(result)
        try:
            deliver(result, fields.get(b"audio"))
        except Exception:  # one session's fault: the reader serves every other session
            log.exception("delivering the result of job %s failed", result.job_id)

    def _repeat(self, result: BusResult) -> bool:
        """Whether this result was delivered already (a job replayed after a failover)."""
        index = getattr(result, "index", -1)
        seq = getattr(result, "seq", None)
        key = (result.job_id, result.kind, index, -1 if seq is None else seq)
        if key in self._seen:
            return True
        self._seen[key] = None
        if len(self._seen) > SEEN_RESULTS:
            self._seen.popitem(last=False)
        return False

    async def reset(self) -> None:
        """Drop results an earlier process with the same id left behind."""
        await self.redis.delete(self.reply_to)


def _no_group(reply: object) -> bool:
    """Whether a reply is Redis saying the stream or its group is gone (with its data)."""
    return isinstance(reply, ResponseError) and "NOGROUP" in str(reply)


def _entry_order(entry_id: bytes) -> tuple[int, int]:
    """A stream entry id (`ms-seq`) as something that sorts as Redis sorts them."""
    ms, _, seq = entry_id.partition(b"-")
    return int(ms), int(seq or 0)
