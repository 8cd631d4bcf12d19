"""Continuous micro-batching of one model for many sessions, off the event loop.

Each caller's `submit` adds its input and waits. Whenever the model's thread is free it
takes every input waiting and runs the model once on all of them; inputs that arrive
meanwhile form the next batch, so batches grow with the load and nothing waits on a
timer. The model runs in its own thread (onnxruntime and CTranslate2 release the GIL), so
the event loop keeps serving sockets during a large batch. Used by the VAD of every
listener (audio/listener.py) and by the gateway's turn model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

In = TypeVar("In")
Out = TypeVar("Out")
R = TypeVar("R")

_Waiting = tuple[Any, Callable[[Any], Any], "asyncio.Future[Any]"]


def _same(output: Any) -> Any:
    return output


class MicroBatcher(Generic[In, Out]):
    """Runs `model(inputs) -> outputs` (one output per input, in order) on batches."""

    def __init__(self, model: Callable[[list[In]], Sequence[Out]], name: str) -> None:
        self.model = model
        self._waiting: list[_Waiting] = []
        self._busy = False
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=name)
        self.calls = 0
        """Model calls made."""
        self.items_run = 0
        """Inputs answered: items_run / calls is the mean batch."""

    async def submit(self, item: In) -> Out:
        """The model's output for `item`, computed in a batch with whoever else waits."""
        result: Out = await self.submit_then(item, _same)
        return result

    async def submit_then(self, item: In, then: Callable[[Out], R]) -> R:
        """As `submit`, with `then(output)` applied on the event loop as soon as the batch
        is done, even if the caller has stopped waiting (a stateful consumer, such as a
        turn segmenter, then stays in step with what the model heard)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        self._waiting.append((item, then, future))
        if not self._busy:
            self._busy = True
            loop.call_soon(self._start)  # after this loop turn: others' inputs join the batch
        return await future

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _start(self) -> None:
        waiting, self._waiting = self._waiting, []
        loop = asyncio.get_running_loop()
        run = loop.run_in_executor(self._executor, self.model, [item for item, _, _ in waiting])
        run.add_done_callback(lambda done: self._finish(waiting, done))

    def _finish(self, waiting: list[_Waiting], run: asyncio.Future[Sequence[Out]]) -> None:
        if self._waiting:
            self._start()  # the next batch goes to the model before this one is handed out
        else:
            self._busy = False
        try:
            outputs = run.result()
        except Exception as exc:
            for _, _, future in waiting:
                if not future.done():
                    future.set_exception(exc)
            return
        self.calls += 1
        self.items_run += len(waiting)
        for (_, then, future), output in zip(waiting, outputs, strict=True):
            try:
                value = then(output)
            except Exception as exc:
                if not future.done():
                    future.set_exception(exc)
                continue
            if not future.done():
                future.set_result(value)
