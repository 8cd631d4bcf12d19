"""The Redis transport of the TTS service: TTS jobs in, audio chunks to the owner's stream.

A job's cancellation (the gateway's barge-in marks its response cancelled) is looked for
once before its synthesis, then every `cancel_poll_s` while it runs, in one lookup for all
of this process's running jobs (`CancelWatch`). Seen, it ends the job at once, whether it
waits for a slot or for the engine's next piece, tells the engine to stop
(services/tts/synthesizer.py), and publishes no chunk more. Chunks made in the moments
before it is seen are dropped by the gateway, which stopped the response already.
"""

from __future__ import annotations

import logging
import time
from contextlib import aclosing
from typing import Final, Literal

from redis.asyncio import Redis

from services.common import metrics
from services.common.audio.pcm import float_to_pcm16, samples_to_ms
from services.common.bus.keys import Keys
from services.common.bus.messages import TtsJob
from services.common.bus.settings import RedisSettings
from services.common.bus.streams import CancelWatch, Delivery, is_cancelled, publish
from services.common.errors import VoiceAgentError
from services.tts.metrics import TTS_CANCELLED
from services.tts.synthesizer import Synthesizer, until_stopped

log = logging.getLogger(__name__)

CANCEL_POLL_S: Final = 0.1
"""How often the running jobs' cancellations are looked for (all in one lookup)."""


class TtsJobHandler:
    """Synthesizes one text chunk, publishing audio as it comes; stops when cancelled."""

    def __init__(
        self, synthesizer: Synthesizer, redis: Redis, settings: RedisSettings, keys: Keys
    ) -> None:
        self.synthesizer = synthesizer
        self.redis = redis
        self.settings = settings
        self.keys = keys
        self.cancels = CancelWatch(redis, keys, CANCEL_POLL_S)

    async def __call__(self, delivery: Delivery) -> None:
        job = TtsJob.model_validate_json(delivery.fields[b"meta"])
        started = time.perf_counter()
        try:
            status, chunks, samples = await self._speak(job)
        except VoiceAgentError as exc:
            metrics.REQUESTS.labels("tts", "job", "error").inc()
            metrics.ERRORS.labels("tts", exc.code).inc()
            await self._publish(job, job.failed(exc.code, exc.message).dump())
            return
        done = job.done(chunks, samples_to_ms(samples, job.sample_rate), status)
        await self._publish(job, done.dump())
        metrics.REQUEST_DURATION.labels("tts", "job").observe(time.perf_counter() - started)
        metrics.REQUESTS.labels("tts", "job", "ok").inc()

    async def _speak(self, job: TtsJob) -> tuple[Literal["completed", "cancelled"], int, int]:
        if await is_cancelled(self.redis, self.keys, job.response_id):
            TTS_CANCELLED.inc()
            return "cancelled", 0, 0
        request = self.synthesizer.request(job.text, job.voice, job, job.continues)
        index = samples = 0
        with self.cancels.watching(job.response_id) as stop:
            stream = self.synthesizer.stream(request, job.sample_rate, job.tenant)
            async with aclosing(until_stopped(stream, stop)) as chunks:
                async for chunk in chunks:
                    await self._publish(job, job.chunk(index).dump(), float_to_pcm16(chunk))
                    index += 1
                    samples += chunk.size
            if stop.is_set():
                TTS_CANCELLED.inc()
                return "cancelled", index, samples
        return "completed", index, samples

    async def _publish(self, job: TtsJob, meta: bytes, audio: bytes | None = None) -> None:
        # each chunk on a replica (wait_replicas) before the next: see bus.publish
        fields = {b"meta": meta} if audio is None else {b"meta": meta, b"audio": audio}
        await publish(self.redis, self.settings, job.reply_to, fields)
