"""The continuous micro-batcher shared by the VAD and the turn model."""

from __future__ import annotations

import asyncio
import threading

import pytest

from services.common.batching import MicroBatcher


async def test_whoever_waits_while_the_model_runs_forms_the_next_batch() -> None:
    release = threading.Event()
    batches: list[list[int]] = []

    def model(items: list[int]) -> list[int]:
        batches.append(items)
        if len(batches) == 1:
            release.wait(5)  # the first call holds the model while the others arrive
        return [2 * i for i in items]

    batcher: MicroBatcher[int, int] = MicroBatcher(model, "test")
    first = asyncio.create_task(batcher.submit(1))
    while not batches:
        await asyncio.sleep(0.001)
    rest = [asyncio.create_task(batcher.submit(i)) for i in (2, 3, 4)]
    await asyncio.sleep(0)
    release.set()
    assert await first == 2
    assert [await task for task in rest] == [4, 6, 8]
    assert batches == [[1], [2, 3, 4]]
    assert (batcher.calls, batcher.items_run) == (2, 4)
    batcher.close()


async def test_then_runs_for_a_caller_that_stopped_waiting() -> None:
    gate = threading.Event()
    seen: list[int] = []

    def model(items: list[int]) -> list[int]:
        gate.wait(5)
        return items

    batcher: MicroBatcher[int, int] = MicroBatcher(model, "test")
    task = asyncio.create_task(batcher.submit_then(7, seen.append))
    await asyncio.sleep(0.01)
    task.cancel()
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    while not seen:  # the batch finishes on the loop and still hands its output over
        await asyncio.sleep(0.001)
    assert seen == [7]
    batcher.close()


async def test_a_model_error_reaches_every_caller_of_that_batch() -> None:
    def model(items: list[int]) -> list[int]:
        raise RuntimeError("model broke")

    batcher: MicroBatcher[int, int] = MicroBatcher(model, "test")
    results = await asyncio.gather(batcher.submit(1), batcher.submit(2), return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results)
    batcher.close()
