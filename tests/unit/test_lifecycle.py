"""Background tasks stop with their service, and a stubborn one cannot hang shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from services.common.service.lifecycle import Background


async def test_stop_cancels_and_waits() -> None:
    background = Background()
    task = background.start(asyncio.sleep(3600), "sleeper")
    await background.stop()
    assert task.cancelled() and background.tasks == []


async def test_a_task_that_ignores_cancel_does_not_hang_stop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(3600)

    background = Background()
    task = background.start(stubborn(), "stubborn")
    await asyncio.sleep(0)
    with caplog.at_level(logging.ERROR):
        await asyncio.wait_for(background.stop(timeout_s=0.2), 5)
    assert "stubborn did not stop" in caplog.text
    release.set()
    task.cancel()
    await asyncio.wait([task], timeout=1)
