"""What a service reports about its own process: event-loop lag, memory and CPU time.

The lag monitor is a task that asks to wake every `interval_s` and records how late it
woke: the time any coroutine, callback or blocking call kept the loop from everything
else (a session's audio, a Redis read). Recent samples stay in a ring buffer (10
minutes by default) for `/health`; every sample also goes to the
`va_event_loop_lag_seconds` histogram.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import resource
import sys
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from services.common.metrics import EVENT_LOOP_LAG
from services.common.stats import percentile


class RecentSamples:
    """Durations of recent events (ring buffer) with percentiles over a time window."""

    def __init__(self, keep: int = 20_000) -> None:
        self._samples: deque[tuple[float, float]] = deque(maxlen=keep)
        """(monotonic time, seconds), oldest first."""

    def record(self, seconds: float, at: float | None = None) -> None:
        self._samples.append((time.monotonic() if at is None else at, seconds))

    def summary(self, window_s: float = 60.0) -> dict[str, Any]:
        """The last `window_s` seconds in milliseconds: p50, p99, max, sample count
        (all 0 with no samples yet)."""
        since = time.monotonic() - window_s
        values = sorted(value for at, value in self._samples if at >= since)
        return {
            "window_s": window_s,
            "p50": _ms(percentile(values, 50)),
            "p99": _ms(percentile(values, 99)),
            "max": _ms(values[-1] if values else 0.0),
            "samples": len(values),
        }


class LoopLagMonitor:
    """Samples the running event loop's lag; `running()` runs it for a block's life."""

    def __init__(self, service: str, interval_s: float = 0.05, keep_s: float = 600.0) -> None:
        if interval_s <= 0 or keep_s < interval_s:
            raise ValueError("need 0 < interval_s <= keep_s")
        self.service = service
        self.interval_s = interval_s
        self._samples = RecentSamples(math.ceil(keep_s / interval_s))

    def record(self, lag_s: float, at: float | None = None) -> None:
        """Keep one sample (taken now unless `at` says when) and count it in the histogram."""
        self._samples.record(lag_s, at)
        EVENT_LOOP_LAG.labels(self.service).observe(lag_s)

    async def run(self) -> None:
        """Sample until cancelled (on the loop's own clock: monotonic, or a test's)."""
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self.record(max(0.0, loop.time() - due))

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Run the monitor on the current loop while the block runs."""
        task = asyncio.create_task(self.run(), name=f"{self.service}-loop-lag")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def summary(self, window_s: float = 60.0) -> dict[str, Any]:
        """Lag over the last `window_s` seconds in milliseconds: p50, p99, max, sample count
        (all 0 with no samples yet)."""
        return self._samples.summary(window_s)


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def process_figures() -> dict[str, Any]:
    """This process's resident memory (bytes) and CPU time so far (user + system seconds)."""
    times = os.times()
    return {"rss_bytes": rss_bytes(), "cpu_seconds": round(times.user + times.system, 3)}


def rss_bytes() -> int:
    """Resident memory now (Linux `/proc/self/statm`); elsewhere the peak, as getrusage has it."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, else KiB
