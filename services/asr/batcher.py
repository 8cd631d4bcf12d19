"""The single door to the ASR model: continuous batching across every source.

Redis jobs, `/v1/stream/asr` segments and REST uploads all call `transcribe`.
Whenever the model is free the batcher takes everything waiting (finals first,
partials only into the slots left, up to `max_batch`) and runs one model call in
its own worker thread. Partials never delay a final: a batch of partials alone runs
interruptibly where the engine can (`InterruptibleEngine`), and a final arriving
meanwhile stops it; its partials go back to the head of their queue. A final batch's
free slots are filled with partials.

Whole-file work (a REST upload with timestamps, a prompt, a translation: `run_alone`)
runs on the same model thread, one file at a time, a step (a 30 s window) at a time,
each step whenever no utterance is waiting: the streaming doors' utterances always go
first, and wait for at most one step of a long file.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from services.asr.engines.base import (
    AsrEngine,
    AsrInput,
    Interrupted,
    InterruptibleEngine,
    Transcript,
)
from services.asr.metrics import (
    ASR_AUDIO_SECONDS,
    ASR_BATCH_SIZE,
    ASR_COMPUTE,
    ASR_DROPPED,
    ASR_INFERENCE,
    ASR_LATENCY,
    ASR_PREEMPTED,
    ASR_QUEUE_WAIT,
)
from services.common.errors import CapacityError
from services.common.service.waiting import set_within

Mode = Literal["final", "partial"]
T = TypeVar("T")


@dataclass(slots=True)
class _Alone:
    """Whole-file work: its steps, its caller's future, the model time it has taken."""

    steps: Generator[Any, None, Any]
    future: asyncio.Future[Any]
    seconds: float = 0.0


def _step(steps: Generator[Any, None, Any]) -> tuple[bool, Any]:
    """One step on the model thread: (finished, the return value). StopIteration cannot
    cross into an asyncio future, so it is caught here."""
    try:
        next(steps)
    except StopIteration as done:
        return True, done.value
    return False, None


@dataclass(slots=True)
class _Waiting:
    item: AsrInput
    mode: Mode
    future: asyncio.Future[Transcript]
    enqueued: float = field(default_factory=time.perf_counter)


class Batcher:
    """Forms batches from waiting utterances and runs them on the engine, one at a time."""

    def __init__(
        self, engine: AsrEngine, max_batch: int, max_queue: int, max_wait_ms: float = 0.0
    ) -> None:
        self.engine = engine
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.max_wait_s = max_wait_ms / 1000
        self._finals: deque[_Waiting] = deque()
        self._partials: deque[_Waiting] = deque()
        self._alone: deque[_Alone] = deque()
        self._wakeup = asyncio.Event()
        self._full = asyncio.Event()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="asr-model")
        self.batches_run = 0
        self.preempted = 0
        self._stop_partials: threading.Event | None = None  # set while partials alone run

    def depth(self) -> int:
        """Utterances waiting for the model."""
        return len(self._finals) + len(self._partials) + len(self._alone)

    async def transcribe(self, item: AsrInput, mode: Mode = "final") -> Transcript:
        """Queue one utterance and wait for its transcript. Full queue: CapacityError."""
        if self.depth() >= self.max_queue:
            ASR_DROPPED.labels("queue_full").inc()
            raise CapacityError(f"ASR queue is full ({self.max_queue} waiting)", retry_after_s=1)
        waiting = _Waiting(item, mode, asyncio.get_running_loop().create_future())
        (self._finals if mode == "final" else self._partials).append(waiting)
        if mode == "final" and self._stop_partials is not None:
            self._stop_partials.set()
        self._wakeup.set()
        if self.depth() >= self.max_batch:
            self._full.set()
        return await waiting.future

    async def run_alone(self, steps: Generator[Any, None, T]) -> T:
        """Run whole-file work on the model thread, a step at a time (each `next(steps)`
        blocks on the model: FileEngine.file_steps), each step once no utterance waits;
        its return value or exception comes back. A caller that goes away stops it at its
        next step. Full queue: CapacityError."""
        if self.depth() >= self.max_queue:
            ASR_DROPPED.labels("queue_full").inc()
            steps.close()
            raise CapacityError(f"ASR queue is full ({self.max_queue} waiting)", retry_after_s=1)
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._alone.append(_Alone(steps, future))
        self._wakeup.set()
        return await future

    async def run(self) -> None:
        """Serve batches until cancelled."""
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup.clear()
                if self.max_wait_s and self.depth() < self.max_batch:
                    await self._wait_for_more()
                while True:
                    if batch := self._take_batch():
                        await self._run_batch(batch)
                    elif self._alone:
                        await self._step_alone(self._alone[0])
                    else:
                        break
        finally:
            self._executor.shutdown(wait=False, cancel_futures=True)

    async def _wait_for_more(self) -> None:
        """Give a batch up to `max_wait_ms` to fill; a full batch goes at once."""
        self._full.clear()
        await set_within(self._full, self.max_wait_s)

    def _take_batch(self) -> list[_Waiting]:
        batch: list[_Waiting] = []
        for source in (self._finals, self._partials):
            while source and len(batch) < self.max_batch:
                waiting = source.popleft()
                if not waiting.future.done():  # the caller may have gone away
                    batch.append(waiting)
        return batch

    async def _step_alone(self, alone: _Alone) -> None:
        """One step of the first whole-file work; it leaves the queue once it is over."""
        loop = asyncio.get_running_loop()
        if alone.future.done():  # the caller went away: its work stops here
            self._alone.popleft()
            await loop.run_in_executor(self._executor, alone.steps.close)
            return
        started = time.perf_counter()
        try:
            finished, result = await loop.run_in_executor(self._executor, _step, alone.steps)
        except Exception as exc:
            self._alone.popleft()
            if not alone.future.done():
                alone.future.set_exception(exc)
            return
        alone.seconds += time.perf_counter() - started
        if finished:
            self._alone.popleft()
            ASR_INFERENCE.observe(alone.seconds)
            if not alone.future.done():
                alone.future.set_result(result)

    async def _run_batch(self, batch: list[_Waiting]) -> None:
        loop = asyncio.get_running_loop()
        inputs = [w.item for w in batch]
        engine = self.engine
        started = time.perf_counter()
        try:
            if isinstance(engine, InterruptibleEngine) and all(w.mode == "partial" for w in batch):
                self._stop_partials = stop = threading.Event()
                try:
                    results = await loop.run_in_executor(
                        self._executor, engine.transcribe_batch_until, inputs, stop
                    )
                finally:
                    self._stop_partials = None
            else:
                results = await loop.run_in_executor(
                    self._executor, engine.transcribe_batch, inputs
                )
        except Interrupted:
            self.preempted += 1
            ASR_PREEMPTED.inc(len(batch))
            self._partials.extendleft(reversed(batch))  # first in line once finals ran
            return
        except Exception as exc:
            for waiting in batch:
                if not waiting.future.done():
                    waiting.future.set_exception(exc)
            return
        done = time.perf_counter()
        self.batches_run += 1
        ASR_INFERENCE.observe(done - started)
        ASR_BATCH_SIZE.observe(len(batch))
        for waiting, result in zip(batch, results, strict=True):
            ASR_AUDIO_SECONDS.inc(result.duration_s)
            ASR_LATENCY.labels(waiting.mode).observe(done - waiting.enqueued)
            # latency = queue wait + compute, per utterance: the load test tells them apart
            ASR_QUEUE_WAIT.labels(waiting.mode).observe(started - waiting.enqueued)
            ASR_COMPUTE.labels(waiting.mode).observe(done - started)
            if not waiting.future.done():
                waiting.future.set_result(result)
