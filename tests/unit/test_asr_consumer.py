"""The ASR service's Redis door: a job's audio reaches the engine with what it says of it."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import numpy as np
import pytest
from redis.asyncio import Redis

from services.asr import consumer
from services.asr.batcher import Batcher
from services.asr.consumer import AsrJobHandler
from services.asr.engines.base import AsrInput, Transcript
from services.common.audio.pcm import float_to_pcm16
from services.common.bus.messages import AsrJob, AsrResult, JobFailed
from services.common.bus.settings import RedisSettings
from services.common.bus.streams import Delivery


class _Engine:
    sample_rate = 16000


class _Batcher:
    engine = _Engine()

    def __init__(self) -> None:
        self.heard: list[AsrInput] = []

    async def transcribe(self, item: AsrInput, mode: str = "final") -> Transcript:
        self.heard.append(item)
        return Transcript(text="hello", language="en")


@pytest.fixture
def published(monkeypatch: pytest.MonkeyPatch) -> list[dict[bytes, bytes]]:
    """What the handler publishes (to its job's reply stream)."""
    sent: list[dict[bytes, bytes]] = []

    async def publish(
        _redis: Any, _settings: Any, _stream: str, fields: Any, durable: bool
    ) -> None:
        sent.append(fields)

    monkeypatch.setattr(consumer, "publish", publish)
    return sent


@pytest.mark.parametrize(
    ("sample_rate", "source_rate", "heard_as"),
    [(16000, 8000, 8000), (16000, None, 16000), (8000, 8000, 8000), (8000, None, 8000)],
)
def test_a_job_s_audio_reaches_the_engine_at_its_rate_with_its_source_rate(
    published: list[dict[bytes, bytes]], sample_rate: int, source_rate: int | None, heard_as: int
) -> None:
    """The source rate the job names; else the rate of the audio it carries (audio sent
    at 8 kHz is telephone-band, whoever sent it)."""
    batcher = _Batcher()
    handler = AsrJobHandler(cast(Batcher, batcher), cast(Redis, None), RedisSettings())
    job = AsrJob(
        job_id="asr_1",
        session_id="sess_1",
        utterance_id="utt_1",
        reply_to="replies",
        sample_rate=sample_rate,
        source_rate=source_rate,
    )
    audio = float_to_pcm16(np.zeros(sample_rate // 2, np.float32))
    asyncio.run(handler(Delivery(b"1-0", {b"meta": job.dump(), b"audio": audio})))
    [item] = batcher.heard
    assert item.source_rate == heard_as
    assert item.audio.size == 8000  # half a second at the engine's 16 kHz
    assert AsrResult.model_validate_json(published[0][b"meta"]).text == "hello"


def test_a_job_longer_than_the_limit_is_refused_not_cut(
    published: list[dict[bytes, bytes]],
) -> None:
    """Whisper hears 30 s at a time: a longer job would lose its end without a word."""
    batcher = _Batcher()
    handler = AsrJobHandler(cast(Batcher, batcher), cast(Redis, None), RedisSettings(), 5.0)
    job = AsrJob(job_id="a", session_id="s", utterance_id="u", reply_to="replies")
    for seconds in (5.0, 5.5):
        audio = float_to_pcm16(np.zeros(int(16000 * seconds), np.float32))
        asyncio.run(handler(Delivery(b"1-0", {b"meta": job.dump(), b"audio": audio})))
    assert len(batcher.heard) == 1  # the 5 s job; the 5.5 s one never reached the engine
    failed = JobFailed.model_validate_json(published[1][b"meta"])
    assert (failed.code, failed.utterance_id) == ("invalid_audio", "u")
    assert "5.5 s of audio; at most 5 s" in failed.message
