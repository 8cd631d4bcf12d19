"""A connection's audio meter against a real Redis that goes away and comes back."""

from __future__ import annotations

from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from services.common.auth.limits import AudioMeter, Limiter
from services.common.errors import QuotaExceeded
from services.ops.redis_server import free_port, start_redis

NOON = 1_764_417_600.0  # 2025-11-29 12:00 UTC


async def test_redis_out_of_reach_costs_the_metering_not_the_session(tmp_path: Path) -> None:
    """With a quota (auth on, the default), the audio path charges Redis about once a
    second: an outage used to end every session with 1011. The audio is kept and charged
    once Redis answers; the quota still holds after."""
    port = free_port()
    proc = start_redis(port, tmp_path)
    redis = Redis(port=port, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    meter = AudioMeter(Limiter(redis, "m", clock=lambda: NOON), "acme", quota_s=10, every_ms=1000)
    try:
        await meter.add_ms(1500)  # charged: 1 500 ms
        proc.kill()
        proc.wait(10)
        for _ in range(3):
            await meter.add_ms(1000)  # Redis gone: kept, no error
        assert meter.pending_ms == pytest.approx(3000)
        proc = start_redis(port, tmp_path)
        await meter.add_ms(1000)  # charged, with what was kept
        # this Redis keeps nothing on disk: the 1 500 ms before went with it
        assert await meter.limiter.audio_used_ms("acme") == 4000  # type: ignore[union-attr]
        with pytest.raises(QuotaExceeded):
            await meter.add_ms(7000)
    finally:
        await redis.aclose()
        proc.kill()
        proc.wait(10)


async def test_audio_is_charged_to_the_utc_day_of_the_limiters_clock(tmp_path: Path) -> None:
    """The quota is per UTC day: a new day starts from nothing, and the refusal says when
    the day ends."""
    port = free_port()
    proc = start_redis(port, tmp_path)
    now = [NOON]
    redis = Redis(port=port)
    limiter = Limiter(redis, "m", clock=lambda: now[0])
    try:
        await limiter.charge_audio("acme", 1500, quota_s=2)
        with pytest.raises(QuotaExceeded) as refused:
            await limiter.charge_audio("acme", 1000, quota_s=2)
        assert refused.value.retry_after_s == pytest.approx(12 * 3600)
        now[0] = NOON + 12 * 3600 + 1  # 00:00:01 the next day
        assert await limiter.audio_used_ms("acme") == 0
        await limiter.check_audio("acme", quota_s=2)
        await limiter.charge_audio("acme", 1000, quota_s=2)
        now[0] = NOON
        assert await limiter.audio_used_ms("acme") == 2500
    finally:
        await redis.aclose()
        proc.kill()
        proc.wait(10)
