"""A job worker stops when cancelled, even when Redis's client turns the cancellation of a
read into an error of its own (which the worker otherwise retries after a backoff) or
swallows it whole (the read returns)."""

from __future__ import annotations

import asyncio
import types
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from services.common.bus.keys import Keys
from services.common.bus.worker import JobWorker


class SwallowingStream:
    """A job stream whose blocking read, when cancelled, raises `error` instead."""

    stream = "jobs"

    def __init__(self, error: Exception | None) -> None:
        self.settings = types.SimpleNamespace(claim_idle_ms=60_000)
        self.error = error
        self.swallow = True
        self.reading = asyncio.Event()

    async def ensure_group(self) -> None:
        return None

    async def reclaim(self, count: int, running: frozenset[bytes] = frozenset()) -> list[Any]:
        return []

    async def touch(self, entries: list[bytes]) -> None:
        return None

    async def read(self, count: int) -> list[Any]:
        self.reading.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if not self.swallow:
                raise
            if self.error is not None:
                raise self.error from None
            # swallowed whole: the read returns as if nothing had come
        return []


async def handler(delivery: Any) -> None:
    return None


@pytest.mark.parametrize(
    "error",
    [RedisConnectionError("Connection closed by server."), ResponseError("LOADING"), None],
    ids=["connection-error", "response-error", "swallowed"],
)
async def test_a_cancelled_worker_stops_even_if_its_read_hides_the_cancel(
    error: Exception | None,
) -> None:
    stream = SwallowingStream(error)
    worker = JobWorker(stream, Keys("t"), handler, 2)  # type: ignore[arg-type]
    task = asyncio.create_task(worker.run())
    try:
        await stream.reading.wait()
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=10)  # a worker that retries never ends
        assert task in done and task.cancelled()
    finally:
        stream.swallow = False  # a worker that went on reading: stop it for good
        task.cancel()
        await asyncio.wait({task}, timeout=5)
