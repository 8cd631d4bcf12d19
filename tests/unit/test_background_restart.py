"""A background task started from a factory that dies unexpectedly is started again after
a backoff (a gateway never goes on without its result reader); one that returns is done;
a bare coroutine's death is recorded for a readiness check."""

from __future__ import annotations

import asyncio

from services.common.service.lifecycle import Background


async def test_a_task_that_dies_is_started_again_with_a_growing_pause() -> None:
    pauses: list[float] = []
    runs = 0
    serving = asyncio.Event()

    async def pause(seconds: float) -> None:
        pauses.append(seconds)

    async def reader() -> None:
        nonlocal runs
        runs += 1
        if runs < 3:
            raise RuntimeError("the reader died")
        serving.set()
        await asyncio.Event().wait()

    background = Background(restart_first_s=0.5, sleep=pause)
    task = background.start(reader, "gateway-results")
    async with asyncio.timeout(5):
        await serving.wait()
    assert runs == 3 and pauses == [0.5, 1.0] and background.restarts == 2
    assert background.healthy()
    await background.stop()
    assert task.cancelled()


async def test_a_task_that_returns_is_not_started_again() -> None:
    runs = 0

    async def work() -> None:
        nonlocal runs
        runs += 1

    background = Background()
    task = background.start(work, "once")
    await asyncio.wait_for(task, 5)
    assert runs == 1 and background.healthy()


async def test_a_bare_coroutine_that_dies_is_recorded() -> None:
    async def work() -> None:
        raise RuntimeError("died")

    background = Background()
    task = background.start(work(), "bare")
    await asyncio.wait([task], timeout=5)
    assert background.dead == ["bare"] and not background.healthy()
    await background.stop()


async def test_a_task_waiting_for_its_restart_is_not_healthy() -> None:
    """Between its death and its restart the service is not serving what the task does:
    `healthy()` (the readiness check `background`) says so, and says it again once the
    task runs."""
    waiting, resume = asyncio.Event(), asyncio.Event()

    async def pause(_: float) -> None:
        waiting.set()
        await resume.wait()

    runs = 0
    serving = asyncio.Event()

    async def worker() -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise RuntimeError("the worker died")
        serving.set()
        await asyncio.Event().wait()

    background = Background(sleep=pause)
    background.start(worker, "asr-worker-0")
    async with asyncio.timeout(5):
        await waiting.wait()
    assert not background.healthy() and background.down == {"asr-worker-0"}
    resume.set()
    async with asyncio.timeout(5):
        await serving.wait()
    assert background.healthy()
    await background.stop()
