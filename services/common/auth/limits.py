"""Abuse limits kept in Redis, so every process of a deployment shares them.

Each check is one Lua script on one key (atomic, and cluster-safe: one key, one slot):
- a fixed window per tenant and kind (`<prefix>:auth:rate:<tenant>:<kind>`): INCR, EXPIRE
  on the first hit, refused above the limit with the window's TTL as the retry hint;
- concurrent sessions as leases in a sorted set (`<prefix>:auth:live:<tenant>`, score =
  lease end by Redis' clock), so a crashed process's sessions expire instead of leaking;
- audio seconds per UTC day (`<prefix>:auth:audio:<tenant>:<yyyymmdd>`, milliseconds).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

from redis.asyncio import Redis

from services.common.bus.connection import REDIS_FAILED
from services.common.bus.keys import Keys
from services.common.errors import QuotaExceeded, RateLimited

log = logging.getLogger(__name__)

_WINDOW: Final = """
local n = redis.call('INCR', KEYS[1])
local ttl = redis.call('TTL', KEYS[1])
if ttl < 0 then
  redis.call('EXPIRE', KEYS[1], ARGV[1])
  ttl = tonumber(ARGV[1])
end
return {n, ttl}
"""
_ACQUIRE: Final = """
local now = tonumber(redis.call('TIME')[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
redis.call('EXPIRE', KEYS[1], 2 * tonumber(ARGV[2]))
return 1
"""
_REFRESH: Final = """
local now = tonumber(redis.call('TIME')[1])
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[1]), ARGV[2])
redis.call('EXPIRE', KEYS[1], 2 * tonumber(ARGV[1]))
return 1
"""
_CHARGE: Final = """
local used = redis.call('INCRBY', KEYS[1], ARGV[1])
if redis.call('TTL', KEYS[1]) < 0 then redis.call('EXPIRE', KEYS[1], 172800) end
return used
"""
LEASE_S: Final = 60
"""A live session's lease; its holder renews it every third of that."""


def seconds_to_midnight_utc(now: float | None = None) -> float:
    return 86_400 - (time.time() if now is None else now) % 86_400


class Limiter:
    """The shared counters of one deployment (`prefix`)."""

    def __init__(self, redis: Redis, prefix: str, clock: Callable[[], float] = time.time) -> None:
        self.redis = redis
        self.prefix = prefix
        self.clock = clock
        """Seconds since the epoch: which UTC day audio is charged to."""
        self.keys = Keys(prefix)
        self._window = redis.register_script(_WINDOW)
        self._acquire = redis.register_script(_ACQUIRE)
        self._refresh = redis.register_script(_REFRESH)
        self._charge = redis.register_script(_CHARGE)

    async def hit(self, tenant: str, kind: str, limit: int | None, window_s: int = 60) -> None:
        """Count one event of `kind`; RateLimited when it is one too many in the window."""
        if limit is None:
            return
        key = self.keys.rate(tenant, kind)
        count, ttl = await self._window(keys=[key], args=[window_s])
        if int(count) > limit:
            raise RateLimited(
                f"over the limit of {limit} {kind.replace('_', ' ')} per {window_s} s; "
                f"retry after {int(ttl)} s",
                retry_after_s=max(1, int(ttl)),
            )

    def _live(self, tenant: str) -> str:
        return self.keys.live_sessions(tenant)

    async def open_session(self, tenant: str, limit: int | None, session: str) -> None:
        """Take a concurrent-session lease; RateLimited when the tenant has `limit` live."""
        if limit is None:
            return
        if not await self._acquire(keys=[self._live(tenant)], args=[limit, LEASE_S, session]):
            raise RateLimited(
                f"over the limit of {limit} concurrent sessions; retry when one ends",
                retry_after_s=5,
            )

    async def renew_session(self, tenant: str, session: str) -> None:
        await self._refresh(keys=[self._live(tenant)], args=[LEASE_S, session])

    async def close_session(self, tenant: str, session: str) -> None:
        await self.redis.zrem(self._live(tenant), session)

    async def live_sessions(self, tenant: str) -> int:
        return int(await self.redis.zcard(self._live(tenant)))

    def _audio(self, tenant: str) -> str:
        return self.keys.audio_used(tenant, time.strftime("%Y%m%d", time.gmtime(self.clock())))

    async def audio_used_ms(self, tenant: str) -> int:
        return int(await self.redis.get(self._audio(tenant)) or 0)

    async def check_audio(self, tenant: str, quota_s: int | None) -> None:
        """QuotaExceeded when today's audio is used up (before a session or request starts)."""
        if quota_s is not None and await self.audio_used_ms(tenant) >= quota_s * 1000:
            raise self._quota_error(quota_s)

    async def charge_audio(self, tenant: str, ms: int, quota_s: int | None) -> None:
        """Add `ms` of audio to today's use; QuotaExceeded once the total is over the quota."""
        if quota_s is None or ms <= 0:
            return
        used = int(await self._charge(keys=[self._audio(tenant)], args=[ms]))
        if used > quota_s * 1000:
            raise self._quota_error(quota_s)

    def _quota_error(self, quota_s: int) -> QuotaExceeded:
        wait = seconds_to_midnight_utc(self.clock())
        return QuotaExceeded(
            f"the daily audio quota ({quota_s} s) is used up; it resets at 00:00 UTC "
            f"(in {int(wait)} s)",
            retry_after_s=wait,
        )


class AudioMeter:
    """One connection's audio, charged to its tenant's quota about once a second."""

    def __init__(
        self, limiter: Limiter | None, tenant: str, quota_s: int | None, every_ms: int = 1000
    ) -> None:
        self.limiter = limiter
        self.tenant = tenant
        self.quota_s = quota_s
        self.every_ms = every_ms
        self.pending_ms = 0.0

    async def add_pcm16(self, n_bytes: int, sample_rate: int) -> None:
        """Count a PCM16 frame; QuotaExceeded once the quota is used up."""
        await self.add_ms(1000 * (n_bytes // 2) / sample_rate)

    async def add_ms(self, ms: float) -> None:
        if self.limiter is None or self.quota_s is None:
            return
        self.pending_ms += ms
        if self.pending_ms >= self.every_ms:
            await self.flush()

    async def flush(self) -> None:
        """Charge what was counted. Redis out of reach (or refusing) costs the metering
        only: the audio stays counted here and is charged once it answers, and the session
        goes on (QuotaExceeded is the only error this raises)."""
        if self.limiter is None or self.pending_ms < 1:
            return
        whole = int(self.pending_ms)
        self.pending_ms -= whole
        try:
            await self.limiter.charge_audio(self.tenant, whole, self.quota_s)
        except REDIS_FAILED as exc:
            self.pending_ms += whole
            now = time.monotonic()
            if now - _unmetered_warned[0] >= 10.0:  # one line every 10 s, not one a second
                _unmetered_warned[0] = now
                log.warning("audio not charged to its quota yet (Redis: %s): kept", exc)


_unmetered_warned = [float("-inf")]  # when a charge that could not be made was last logged

NO_METER: Final = AudioMeter(None, "", None)
