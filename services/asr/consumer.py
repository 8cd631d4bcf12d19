"""The Redis transport of the ASR service: ASR jobs in, transcripts to the owner's stream."""

from __future__ import annotations

import asyncio
import time

from redis.asyncio import Redis

from services.asr.batcher import Batcher
from services.asr.engines.base import AsrInput
from services.common import metrics
from services.common.audio.pcm import pcm16_to_float, resample
from services.common.bus.messages import AsrJob
from services.common.bus.settings import RedisSettings
from services.common.bus.streams import Delivery, publish
from services.common.errors import InvalidAudio, VoiceAgentError


class AsrJobHandler:
    """Transcribes one job through the batcher and publishes the result."""

    def __init__(
        self,
        batcher: Batcher,
        redis: Redis,
        settings: RedisSettings,
        max_utterance_s: float = 30.0,
    ) -> None:
        self.batcher = batcher
        self.redis = redis
        self.settings = settings
        self.max_utterance_s = max_utterance_s

    async def __call__(self, delivery: Delivery) -> None:
        job = AsrJob.model_validate_json(delivery.fields[b"meta"])
        started = time.perf_counter()
        try:
            audio = pcm16_to_float(delivery.fields.get(b"audio", b""))
            if audio.size > self.max_utterance_s * job.sample_rate:
                raise InvalidAudio(
                    f"the job holds {audio.size / job.sample_rate:.1f} s of audio; "
                    f"at most {self.max_utterance_s:g} s (VA_ASR__MAX_UTTERANCE_S)"
                )
            rate = self.batcher.engine.sample_rate
            if job.sample_rate != rate:
                audio = await asyncio.to_thread(resample, audio, job.sample_rate, rate)
            item = AsrInput(audio, job.language, job.captured_rate)
            transcript = await self.batcher.transcribe(item, job.mode)
        except VoiceAgentError as exc:
            metrics.REQUESTS.labels("asr", "job", "error").inc()
            metrics.ERRORS.labels("asr", exc.code).inc()
            failed = job.failed(exc.code, exc.message)
            await publish(
                self.redis, self.settings, job.reply_to, {b"meta": failed.dump()}, durable=True
            )
            return
        result = job.result(
            transcript.text,
            transcript.language,
            (time.perf_counter() - started) * 1000,
            transcript.last_word_logprob,
            transcript.avg_logprob,
        )
        # the job's only result: on a replica (wait_replicas) before it is marked done
        durable = job.mode == "final"
        await publish(
            self.redis, self.settings, job.reply_to, {b"meta": result.dump()}, durable=durable
        )
        elapsed = time.perf_counter() - started
        metrics.REQUEST_DURATION.labels("asr", "job").observe(elapsed)
        metrics.REQUESTS.labels("asr", "job", "ok").inc()
