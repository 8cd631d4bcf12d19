"""The gateway's side of the Redis bus: submit jobs, receive results on its own stream."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import Any

from pydantic import ValidationError
from redis.asyncio import Redis

from services.common.bus.connection import REDIS_DOWN
from services.common.bus.durable import Fields
from services.common.bus.keys import Keys
from services.common.bus.messages import RESULTS, AsrJob, BusResult, TtsJob
from services.common.bus.settings import RedisSettings
from services.common.bus.streams import JobStream, cancel

log = logging.getLogger(__name__)

Deliver = Callable[[BusResult, bytes | None], None]
SEEN_RESULTS = 8192  # results remembered to drop repeats (a job replayed after a failover)


@contextlib.asynccontextmanager
async def _unreachable(what: str) -> AsyncIterator[None]:
    """Redis out of reach drops the job (or the cancellation) instead of failing the
    session: the session's own timeouts tell the client (`asr_unavailable` after
    `asr_timeout_s`, `tts_unavailable` after `tts_timeout_s`), and a job's partial or
    speculative transcript was droppable anyway. The fault drill found sessions closed with
    1011 when Redis restarted (docs/fault-drill.md)."""
    try:
        yield
    except REDIS_DOWN as exc:
        log.warning("redis unreachable: %s dropped (%s)", what, exc)


class GatewayBus:
    """Submits ASR/TTS jobs whose results come back to this gateway's stream."""

    def __init__(self, redis: Redis, settings: RedisSettings, gateway_id: str) -> None:
        self.redis = redis
        self.settings = settings
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

    async def submit_asr(self, job: AsrJob, pcm16: bytes) -> None:
        """A final transcript is a user's turn: it waits for replicas (`wait_replicas`)."""
        stream = self._asr[job.mode][self.keys.shard_of(job.session_id)]
        fields: Fields = {b"meta": job.dump(), b"audio": pcm16}
        async with _unreachable(f"the ASR job {job.job_id}"):
            await stream.submit(fields, durable=job.mode == "final")

    async def submit_tts(self, job: TtsJob) -> None:
        """The spoken answer of a turn: it waits for replicas too."""
        stream = self._tts[self.keys.shard_of(job.session_id)]
        async with _unreachable(f"the TTS job {job.job_id}"):
            await stream.submit({b"meta": job.dump()}, durable=True)

    async def cancel(self, response_id: str) -> None:
        async with _unreachable(f"the cancellation of {response_id}"):
            await cancel(self.redis, self.keys, self.settings, response_id)

    async def route_results(self, deliver: Deliver) -> None:
        """Read this gateway's result stream forever, handing each result to `deliver`.

        Starts from the beginning: `reset` cleared what an earlier process left.
        """
        last_id = b"0-0"
        backoff = 0.2
        while True:
            try:
                reply: Any = await self.redis.xread(
                    {self.reply_to: last_id}, count=256, block=self.settings.block_ms
                )
                backoff = 0.2
            except REDIS_DOWN as exc:
                log.warning("redis unreachable reading results: %s", exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            for _, entries in reply or []:
                for entry_id, fields in entries:
                    last_id = entry_id
                    self._dispatch(fields, deliver)

    def _dispatch(self, fields: Fields, deliver: Deliver) -> None:
        try:
            result = RESULTS.validate_json(fields[b"meta"])
        except (KeyError, ValidationError):
            log.error("malformed result dropped: %r", fields.get(b"meta", b"")[:200])
            return
        if self._repeat(result):
            log.info("repeated result of job %s dropped", result.job_id)
            return
        deliver(result, fields.get(b"audio"))

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
