"""Background tasks owned by a service for its lifetime (held references, clean cancel).

A task started from a factory (a function that makes its coroutine) is supervised: if it
dies unexpectedly (raises anything but its cancellation) it is logged and started again
after a backoff, so a service never goes on serving without, say, its result reader. A task
started from a bare coroutine cannot be made again: its death is logged and recorded in
`dead`, which `healthy()` reports for a readiness check.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)

Work = Coroutine[Any, Any, Any] | Callable[[], Coroutine[Any, Any, Any]]
Sleep = Callable[[float], Awaitable[None]]
RESTART_FIRST_S = 0.5  # the first pause before a died task is started again; doubles
RESTART_MAX_S = 30.0
RESTART_SETTLED_S = 60.0  # a run at least this long starts the backoff over


class Background:
    """Named long-running tasks; one that dies unexpectedly is restarted (from a factory)
    or logged and recorded (from a bare coroutine), never lost."""

    def __init__(self, restart_first_s: float = RESTART_FIRST_S, sleep: Sleep = asyncio.sleep):
        self.tasks: list[asyncio.Task[Any]] = []
        self.dead: list[str] = []
        """Names of the tasks that died and will not run again."""
        self.down: set[str] = set()
        """Names of supervised tasks that died and wait for their restart."""
        self.restarts = 0
        """How many times a supervised task was started again after dying."""
        self._restart_first_s = restart_first_s
        self._sleep = sleep

    def start(self, work: Work, name: str) -> asyncio.Task[Any]:
        """Run `work`: a coroutine, or a factory of coroutines (then restarted if it dies)."""
        coro = work if asyncio.iscoroutine(work) else self._supervise(work, name)
        task = asyncio.create_task(coro, name=name)
        task.add_done_callback(self._report)
        self.tasks.append(task)
        return task

    def healthy(self) -> bool:
        """Whether every task runs: none died for good, none waits for its restart (the
        service's readiness check `background`)."""
        return not self.dead and not self.down

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

    async def _supervise(self, make: Callable[[], Coroutine[Any, Any, Any]], name: str) -> None:
        """Run `make()` until it returns (its work is done) or is cancelled; start it again,
        after a backoff, each time it raises."""
        loop = asyncio.get_running_loop()
        pause = self._restart_first_s
        while True:
            began = loop.time()
            try:
                await make()
                return
            except Exception:
                if loop.time() - began >= RESTART_SETTLED_S:
                    pause = self._restart_first_s
                log.exception("background task %s died: started again in %.1f s", name, pause)
            self.down.add(name)
            try:
                await self._sleep(pause)
            finally:
                self.down.discard(name)
            pause = min(pause * 2, RESTART_MAX_S)
            self.restarts += 1

    def _report(self, task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.dead.append(task.get_name())
            log.error("background task %s died", task.get_name(), exc_info=task.exception())
