"""Running one load level: its sessions in this process, or spread over worker processes.

Each worker runs its share of the sessions (session i goes to worker i mod K) on its
own event loop, against one shared timeline (a wall-clock start), reports progress
through a queue, and returns a `LevelPart`; the parent merges them.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, replace
from multiprocessing import get_context
from typing import Any, Final

from services.loadtest.level import LevelPart
from services.loadtest.user import Live, SessionRun, User, UserPlan, Window

LAG_PERIOD_S: Final = 0.05
REPORT_EVERY_S: Final = 0.5


@dataclass(frozen=True)
class LevelJob:
    """One worker's share of one level."""

    plan: UserPlan
    timeline: Window  # on time.time(): the clock every worker process shares
    indices: tuple[int, ...]

    def window(self) -> Window:
        """The timeline on this process's time.monotonic, which the users pace by."""
        return replace(self.timeline, start=time.monotonic() + (self.timeline.start - time.time()))


@dataclass
class Snapshot:
    """Progress of the whole level, as the progress line shows it."""

    up: int = 0
    turns: int = 0  # in the measured window, as the results count them
    errors: int = 0
    v2v_ms: list[float] | None = None
    ramp_turns: int = 0


Progress = Callable[[Snapshot], None]


async def run_share(job: LevelJob, live: Live) -> LevelPart:
    """Run this share's sessions to their end; the figures of all of them."""
    window = job.window()
    lags: list[float] = []
    sampler = asyncio.create_task(_sample_lag(lags), name="loop-lag")
    try:
        results = await asyncio.gather(
            *(User(job.plan, window, i, live).run() for i in job.indices), return_exceptions=True
        )
    finally:
        sampler.cancel()
    part = LevelPart(loop_lag_ms=lags)
    for result in results:
        if isinstance(result, SessionRun):
            part.add_session(result)
        else:
            traceback.print_exception(result, file=sys.stderr)
            part.attempts += 1
            part.errors["client_exception"] += 1
    return part


async def _sample_lag(samples: list[float]) -> None:
    while True:
        due = time.monotonic() + LAG_PERIOD_S
        await asyncio.sleep(LAG_PERIOD_S)
        samples.append(max(0.0, time.monotonic() - due) * 1000)


async def run_local(job: LevelJob, progress: Progress) -> LevelPart:
    """The whole level on this process's loop, calling `progress` as it goes."""
    live = Live()
    reporter = asyncio.create_task(_report(live, progress), name="progress")
    try:
        return await run_share(job, live)
    finally:
        reporter.cancel()


async def _report(live: Live, progress: Progress) -> None:
    while True:
        progress(Snapshot(live.up, live.turns, live.errors, list(live.v2v_ms), live.ramp_turns))
        await asyncio.sleep(REPORT_EVERY_S)


# ---------------------------------------------------------------------- workers

_QUEUE: Any = None


def _init_worker(progress_queue: Any, started: Any) -> None:
    global _QUEUE, _STARTED
    _QUEUE, _STARTED = progress_queue, started


_STARTED: Any = None
STARTUP_TIMEOUT_S: Final = 120.0
"""How long the worker processes may take to start (spawn and import the client)."""


def _started() -> None:
    """Every worker process is up and has imported what it runs: each waits for the others,
    so no process can take two of these."""
    _STARTED.wait(STARTUP_TIMEOUT_S)


def _worker(job: LevelJob, worker: int) -> LevelPart:
    """A worker process's share of one level."""
    sent = 0

    def report(snapshot: Snapshot) -> None:
        nonlocal sent
        fresh = (snapshot.v2v_ms or [])[sent:]
        sent += len(fresh)
        _QUEUE.put(
            (worker, (snapshot.up, snapshot.turns, snapshot.errors, snapshot.ramp_turns), fresh)
        )

    return asyncio.run(run_local(job, report))


class Workers:
    """K worker processes kept for the whole run."""

    def __init__(self, count: int) -> None:
        context = get_context("spawn")
        self.queue = context.Queue()
        started = context.Barrier(count)
        self.pool = ProcessPoolExecutor(
            count, mp_context=context, initializer=_init_worker, initargs=(self.queue, started)
        )
        # start them all now: a level's clock must not run while processes spawn and import
        # (seconds on a busy machine), or its sessions would begin after its window
        for future in [self.pool.submit(_started) for _ in range(count)]:
            future.result(STARTUP_TIMEOUT_S)

    def run(self, jobs: list[LevelJob], progress: Progress) -> LevelPart:
        futures = [self.pool.submit(_worker, job, w) for w, job in enumerate(jobs)]
        state: dict[int, tuple[int, int, int, int]] = {}
        v2v: list[float] = []
        while not all(f.done() for f in futures):
            for worker, counts, fresh in self._drain():
                state[worker] = counts
                v2v.extend(fresh)
            totals = [sum(column) for column in zip(*state.values(), strict=True)] or [0] * 4
            progress(Snapshot(totals[0], totals[1], totals[2], v2v, totals[3]))
        for _ in self._drain(wait=False):
            pass  # late reports of this level must not count in the next
        return _merged(futures)

    def _drain(
        self, wait: bool = True
    ) -> Iterator[tuple[int, tuple[int, int, int, int], list[float]]]:
        """Progress reports waiting in the queue (after up to one report period)."""
        with contextlib.suppress(queue.Empty):
            if wait:
                yield self.queue.get(timeout=REPORT_EVERY_S)
            while True:
                yield self.queue.get_nowait()

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)


def _merged(futures: list[Future[LevelPart]]) -> LevelPart:
    part = LevelPart()
    for future in futures:
        part.merge(future.result())
    return part


def split(plan: UserPlan, timeline: Window, workers: int) -> list[LevelJob]:
    """One job per worker that has sessions (session i → worker i mod K)."""
    sessions = timeline.sessions
    shares = [tuple(range(w, sessions, workers)) for w in range(min(workers, sessions))]
    return [LevelJob(plan, timeline, share) for share in shares]
