"""The event-loop lag monitor and the process figures /health reports."""

from __future__ import annotations

import asyncio
import mmap
import resource
import time
from collections.abc import Callable

import numpy as np
import pytest
from prometheus_client import REGISTRY

from services.common.service.process import LoopLagMonitor, process_figures, rss_bytes
from services.common.stats import percentile
from tests.component.session_harness import on_virtual_time


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


def samples(monitor: LoopLagMonitor) -> int:
    return int(monitor.summary()["samples"])


async def test_a_blocked_loop_shows_as_lag() -> None:
    monitor = LoopLagMonitor("test-blocked", interval_s=0.02)
    async with monitor.running():
        await until(lambda: samples(monitor) >= 5)
        time.sleep(0.2)  # a coroutine that blocks the loop, as a slow codec call would
        before = samples(monitor)
        await until(lambda: samples(monitor) >= before + 3)
    lag = monitor.summary()
    assert lag["max"] >= 150 and lag["p99"] >= 150  # at least the block, however busy
    assert lag["window_s"] == 60


@on_virtual_time
async def test_an_idle_loop_shows_no_lag() -> None:
    """On a loop nothing blocks (virtual time: no other process can delay it either), every
    wake-up is on time: the monitor adds no lag of its own."""
    monitor = LoopLagMonitor("test-idle", interval_s=0.02)
    async with monitor.running():
        await asyncio.sleep(1.0)
    lag = monitor.summary(window_s=600)
    assert lag["samples"] >= 45 and lag["max"] == 0.0, lag


async def test_the_monitor_stops_with_its_block() -> None:
    monitor = LoopLagMonitor("test-stop", interval_s=0.01)
    async with monitor.running():
        await until(lambda: samples(monitor) >= 2)
    stopped_at = samples(monitor)
    await asyncio.sleep(0.05)  # five intervals: a running monitor would have sampled
    assert samples(monitor) == stopped_at
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "test-stop-loop-lag"]


async def test_samples_go_to_the_histogram() -> None:
    def count() -> float:
        value = REGISTRY.get_sample_value(
            "va_event_loop_lag_seconds_count", {"service": "test-histogram"}
        )
        return value or 0.0

    monitor = LoopLagMonitor("test-histogram")
    monitor.record(0.03)
    monitor.record(0.0005)
    assert count() == 2
    slow = REGISTRY.get_sample_value(
        "va_event_loop_lag_seconds_bucket", {"service": "test-histogram", "le": "0.02"}
    )
    assert slow == 1  # 1 ms and 20 ms land in different buckets


def test_the_window_narrows_to_recent_samples() -> None:
    monitor = LoopLagMonitor("test-window", interval_s=0.05)
    now = time.monotonic()
    monitor.record(0.5, at=now - 120)  # two minutes ago
    for lag in (0.001, 0.002, 0.003, 0.004):
        monitor.record(lag, at=now - 30)
    monitor.record(0.010, at=now - 1)
    assert monitor.summary() == {
        "window_s": 60,
        "p50": 3.0,
        "p99": 10.0,
        "max": 10.0,
        "samples": 5,
    }
    assert monitor.summary(300)["max"] == 500.0
    assert monitor.summary(10) == {
        "window_s": 10,
        "p50": 10.0,
        "p99": 10.0,
        "max": 10.0,
        "samples": 1,
    }


def test_no_samples_is_all_zero() -> None:
    lag = LoopLagMonitor("test-empty").summary(5)
    assert lag == {"window_s": 5, "p50": 0.0, "p99": 0.0, "max": 0.0, "samples": 0}


def test_the_ring_buffer_keeps_only_keep_s() -> None:
    monitor = LoopLagMonitor("test-ring", interval_s=0.1, keep_s=1.0)
    for _ in range(25):
        monitor.record(0.001)
    assert samples(monitor) == 10
    with pytest.raises(ValueError):
        LoopLagMonitor("test-bad", interval_s=0)


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert [percentile(values, p) for p in (1, 50, 99, 100)] == [1.0, 50.0, 99.0, 100.0]
    assert percentile([7.0], 50) == 7.0 and percentile([], 99) == 0.0


def test_process_figures_follow_the_process() -> None:
    figures = process_figures()
    assert figures.keys() == {"rss_bytes", "cpu_seconds"}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert 10 << 20 < figures["rss_bytes"] <= peak + (4 << 20)  # the kernel updates the peak lazily
    # 64 MiB of fresh pages, touched: an anonymous mapping of its own, as malloc may hand
    # out heap memory a freed block left resident (the suite's process is GBs by now)
    block = mmap.mmap(-1, 64 << 20)
    pages = np.frombuffer(block, dtype=np.uint8)
    pages[:: mmap.PAGESIZE] = 1
    assert rss_bytes() - figures["rss_bytes"] > 48 << 20
    del pages
    block.close()
    spin_until = time.process_time() + 0.1
    while time.process_time() < spin_until:
        pass
    assert process_figures()["cpu_seconds"] >= figures["cpu_seconds"] + 0.09
