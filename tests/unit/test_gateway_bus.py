"""The gateway's job submissions while Redis is out of reach: a job that carries a turn is
tried again for the session's timeout (a cluster failover outlasts the client's own
retries; CI lost turns to that), a droppable one is dropped at once."""

from __future__ import annotations

from typing import Any, cast

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from services.common.bus.messages import AsrJob, TtsJob
from services.common.bus.settings import RedisSettings
from services.gateway.bus import GatewayBus


class FlakyRedis:
    """XADD fails `failures` times with a connection error, then appends."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.tries = 0
        self.added: list[tuple[str, dict[bytes, bytes]]] = []

    async def xadd(self, stream: str, fields: dict[bytes, bytes], **_: Any) -> bytes:
        self.tries += 1
        if self.tries <= self.failures:
            raise RedisConnectionError("Error 111 connecting to 127.0.0.1:7000.")
        self.added.append((stream, fields))
        return b"1-0"


class Clock:
    """Time that moves only when the bus sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def bus_on(redis: FlakyRedis, retry_s: float, clock: Clock) -> GatewayBus:
    return GatewayBus(
        cast(Redis, redis), RedisSettings(), "gw-1", retry_s=retry_s, sleep=clock.sleep, clock=clock
    )


def tts_job() -> TtsJob:
    return TtsJob(
        job_id="tts_1", session_id="s1", response_id="r1", seq=0, text="hi", voice="v",
        sample_rate=24000, reply_to="results",
    )  # fmt: skip


def asr_job(mode: str) -> AsrJob:
    return AsrJob(
        job_id=f"asr_{mode}", session_id="s1", utterance_id="u1", reply_to="results",
        mode="final" if mode == "final" else "partial",
    )  # fmt: skip


async def test_a_turns_tts_job_is_tried_again_until_redis_answers() -> None:
    clock = Clock()
    redis = FlakyRedis(failures=4)
    await bus_on(redis, retry_s=15.0, clock=clock).submit_tts(tts_job())
    assert redis.tries == 5 and len(redis.added) == 1
    assert b"tts_1" in redis.added[0][1][b"meta"]
    assert clock.slept == [0.25, 0.5, 1.0, 2.0]  # backs off, capped


async def test_a_final_transcript_job_is_tried_again_a_partial_is_not() -> None:
    clock = Clock()
    final, partial = FlakyRedis(failures=2), FlakyRedis(failures=2)
    await bus_on(final, retry_s=15.0, clock=clock).submit_asr(asr_job("final"), b"\0\0")
    await bus_on(partial, retry_s=15.0, clock=clock).submit_asr(asr_job("partial"), b"\0\0")
    assert final.tries == 3 and len(final.added) == 1
    assert partial.tries == 1 and partial.added == []  # droppable: no second try


async def test_a_job_is_dropped_once_the_window_is_spent_without_raising() -> None:
    clock = Clock()
    redis = FlakyRedis(failures=1000)
    await bus_on(redis, retry_s=3.0, clock=clock).submit_tts(tts_job())
    assert redis.added == []
    assert sum(clock.slept) == 3.0  # never sleeps past the window
    assert clock.slept[-1] <= 2.0


async def test_no_window_means_one_try() -> None:
    clock = Clock()
    redis = FlakyRedis(failures=1)
    await bus_on(redis, retry_s=0.0, clock=clock).submit_tts(tts_job())
    assert redis.tries == 1 and redis.added == [] and clock.slept == []
