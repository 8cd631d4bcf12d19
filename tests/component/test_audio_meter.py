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


async def test_redis_out_of_reach_costs_the_metering_not_the_session(tmp_path: Path) -> None:
    """With a quota (auth on, the default), the audio path charges Redis about once a
    second: an outage used to end every session with 1011. The audio is kept and charged
    once Redis answers; the quota still holds after."""
    port = free_port()
    proc = start_redis(port, tmp_path)
    redis = Redis(port=port, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    meter = AudioMeter(Limiter(redis, "m"), "acme", quota_s=10, every_ms=1000)
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
