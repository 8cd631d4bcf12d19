"""Background tasks owned by a service for its lifetime (held references, clean cancel)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


class Background:
    """Named long-running tasks; a task that dies unexpectedly is logged, not lost."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[Any]] = []

    def start(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        task.add_done_callback(self._report)
        self.tasks.append(task)
        return task

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.tasks.clear()

    @staticmethod
    def _report(task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("background task %s died", task.get_name(), exc_info=task.exception())
