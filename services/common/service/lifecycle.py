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

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Cancel every task and wait for them, at most `timeout_s` (shutdown never hangs)."""
        for task in self.tasks:
            task.cancel()
        if self.tasks:
            _, stuck = await asyncio.wait(self.tasks, timeout=timeout_s)
            for task in stuck:
                log.error("background task %s did not stop in %.0f s", task.get_name(), timeout_s)
        for task in self.tasks:
            if task.done():
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    task.result()
        self.tasks.clear()

    @staticmethod
    def _report(task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("background task %s died", task.get_name(), exc_info=task.exception())
