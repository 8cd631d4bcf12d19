"""The ASR batcher: batch formation under concurrency, priorities, limits, failures.

A fake engine records every batch and can hold the model "busy" on an Event, so the
tests decide exactly what is waiting when the model frees up. The last tests run the
real faster-whisper engine on the tiny random-weight model through the batcher.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from services.asr.batcher import Batcher, Mode
from services.asr.engines.base import AsrInput, Interrupted, Transcript
from services.asr.engines.whisper import FasterWhisperEngine
from services.asr.settings import WhisperSettings
from services.common.errors import CapacityError
from tests.tiny_whisper import build_tiny_whisper, offline

RATE = 16000


class FakeEngine:
    """Records batches (by label, the `language` field); the first batch can be held."""

    name = "fake"
    sample_rate = RATE
    model = "fake"
    device = "cpu"

    def __init__(self, hold_first: bool = False, fail_on: str | None = None) -> None:
        self.batches: list[list[str]] = []
        self.started = threading.Event()
        self.release = threading.Event()
        self.fail_on = fail_on
        if not hold_first:
            self.release.set()

    def load(self) -> None:
        pass

    def transcribe_batch(self, items: Sequence[AsrInput]) -> list[Transcript]:
        labels = [item.language or "" for item in items]
        self.batches.append(labels)
        self.started.set()
        assert self.release.wait(10), "the test never released the model"
        if self.fail_on is not None and self.fail_on in labels:
            raise RuntimeError(f"engine failed on {self.fail_on}")
        return transcripts(labels)

    def sizes(self) -> list[int]:
        return [len(batch) for batch in self.batches]


def transcripts(labels: list[str]) -> list[Transcript]:
    return [Transcript(text=f"text of {label}", language=label) for label in labels]


def item(label: str) -> AsrInput:
    return AsrInput(np.zeros(160, dtype=np.float32), language=label)


@pytest.fixture
def running() -> Iterator[list[asyncio.Task[None]]]:
    tasks: list[asyncio.Task[None]] = []
    yield tasks
    for task in tasks:
        task.cancel()


def start(batcher: Batcher, tasks: list[asyncio.Task[None]]) -> None:
    tasks.append(asyncio.create_task(batcher.run()))


def submit(batcher: Batcher, label: str, mode: Mode = "final") -> asyncio.Task[Transcript]:
    return asyncio.create_task(batcher.transcribe(item(label), mode))


async def busy(engine: FakeEngine) -> None:
    """Wait until the model is running the first batch."""
    assert await asyncio.to_thread(engine.started.wait, 10)


async def settle(batcher: Batcher, depth: int) -> None:
    """Wait until `depth` utterances are queued (the tasks have run to their await)."""
    for _ in range(1000):
        if batcher.depth() == depth:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"queue depth {batcher.depth()}, expected {depth}")


def finals(*labels: str) -> list[tuple[str, Mode]]:
    return [(label, "final") for label in labels]


def partials(*labels: str) -> list[tuple[str, Mode]]:
    return [(label, "partial") for label in labels]


async def behind_first(
    batcher: Batcher, engine: FakeEngine, first: str, waiting: list[tuple[str, Mode]]
) -> list[asyncio.Task[Transcript]]:
    """`first` (a final) holds the model while `waiting` queues up; every task, in that order."""
    tasks = [submit(batcher, first)]
    await busy(engine)
    tasks += [submit(batcher, label, mode) for label, mode in waiting]
    await settle(batcher, len(waiting))
    return tasks


async def test_the_rest_go_in_one_batch_while_the_model_is_busy(
    running: list[asyncio.Task[None]],
) -> None:
    engine = FakeEngine(hold_first=True)
    batcher = Batcher(engine, max_batch=8, max_queue=100)
    start(batcher, running)
    tasks = await behind_first(batcher, engine, "u0", finals(*(f"u{i}" for i in range(1, 21))))
    engine.release.set()
    results = await asyncio.gather(*tasks)
    assert engine.sizes() == [1, 8, 8, 4]
    assert [r.language for r in results] == [f"u{i}" for i in range(21)]
    assert [label for batch in engine.batches for label in batch] == [f"u{i}" for i in range(21)]
    assert batcher.batches_run == 4


async def test_everything_waiting_at_once_is_one_batch(running: list[asyncio.Task[None]]) -> None:
    engine = FakeEngine()
    batcher = Batcher(engine, max_batch=16, max_queue=100)
    start(batcher, running)
    await asyncio.gather(*(batcher.transcribe(item(f"u{i}")) for i in range(12)))
    assert engine.sizes() == [12]


@pytest.mark.parametrize(
    ("max_batch", "waiting_partials", "expected"),
    [
        (4, 3, [["f0"], ["f1", "f2", "f3", "p0"], ["p1", "p2"]]),
        (2, 4, [["f0"], ["f1", "f2"], ["f3", "p0"], ["p1", "p2"], ["p3"]]),
    ],
    ids=["partials-fill-leftover-slots", "partials-never-take-a-final-slot"],
)
async def test_finals_first_and_partials_only_fill_leftover_slots(
    running: list[asyncio.Task[None]],
    max_batch: int,
    waiting_partials: int,
    expected: list[list[str]],
) -> None:
    engine = FakeEngine(hold_first=True)
    batcher = Batcher(engine, max_batch=max_batch, max_queue=100)
    start(batcher, running)
    waiting = partials(*(f"p{i}" for i in range(waiting_partials))) + finals("f1", "f2", "f3")
    tasks = await behind_first(batcher, engine, "f0", waiting)
    engine.release.set()
    await asyncio.gather(*tasks)
    assert engine.batches == expected


class InterruptibleFake(FakeEngine):
    """Partial batches run until released or stopped, as an interruptible engine's call does;
    other batches run at once."""

    def transcribe_batch(self, items: Sequence[AsrInput]) -> list[Transcript]:
        labels = [item.language or "" for item in items]
        self.batches.append(labels)
        return transcripts(labels)

    def transcribe_batch_until(
        self, items: Sequence[AsrInput], stop: threading.Event
    ) -> list[Transcript]:
        labels = [item.language or "" for item in items]
        self.batches.append(["until", *labels])
        self.started.set()
        while not self.release.wait(0.005):
            if stop.is_set():
                raise Interrupted
        return transcripts(labels)


async def test_a_final_interrupts_a_batch_of_partials(running: list[asyncio.Task[None]]) -> None:
    engine = InterruptibleFake(hold_first=True)
    batcher = Batcher(engine, max_batch=4, max_queue=100)
    start(batcher, running)
    partials = [submit(batcher, f"p{i}", "partial") for i in range(2)]
    await busy(engine)
    final = submit(batcher, "f0")
    assert (await asyncio.wait_for(final, 5)).language == "f0"
    # the interrupted partials are not lost: they fill the final's free slots
    assert [(await p).language for p in partials] == ["p0", "p1"]
    assert engine.batches == [["until", "p0", "p1"], ["f0", "p0", "p1"]]
    assert batcher.preempted == 1


async def test_batches_with_a_final_are_never_interruptible(
    running: list[asyncio.Task[None]],
) -> None:
    engine = InterruptibleFake()
    batcher = Batcher(engine, max_batch=4, max_queue=100)
    both = [submit(batcher, "f0"), submit(batcher, "p0", "partial")]
    await settle(batcher, 2)
    start(batcher, running)
    await asyncio.gather(*both)
    assert engine.batches == [["f0", "p0"]]


async def test_max_wait_lets_a_batch_fill(running: list[asyncio.Task[None]]) -> None:
    engine = FakeEngine()
    batcher = Batcher(engine, max_batch=8, max_queue=100, max_wait_ms=300)
    start(batcher, running)
    first = submit(batcher, "a")
    await asyncio.sleep(0.05)
    second = submit(batcher, "b")
    await asyncio.gather(first, second)
    assert engine.sizes() == [2]


async def test_without_max_wait_the_model_starts_at_once(
    running: list[asyncio.Task[None]],
) -> None:
    engine = FakeEngine()
    batcher = Batcher(engine, max_batch=8, max_queue=100)
    start(batcher, running)
    await submit(batcher, "a")
    await submit(batcher, "b")
    assert engine.sizes() == [1, 1]


async def test_a_full_batch_does_not_wait(running: list[asyncio.Task[None]]) -> None:
    engine = FakeEngine()
    batcher = Batcher(engine, max_batch=4, max_queue=100, max_wait_ms=60_000)
    start(batcher, running)
    first = submit(batcher, "a")
    await asyncio.sleep(0.02)
    rest = [submit(batcher, label) for label in "bcd"]
    # the batch filled: waiting out max_wait (a minute) would trip the timeout
    await asyncio.wait_for(asyncio.gather(first, *rest), timeout=10)
    assert engine.sizes() == [4]


async def test_a_lone_utterance_waits_at_most_max_wait(
    running: list[asyncio.Task[None]],
) -> None:
    engine = FakeEngine()
    batcher = Batcher(engine, max_batch=8, max_queue=100, max_wait_ms=100)
    start(batcher, running)
    began = time.perf_counter()
    await submit(batcher, "a")
    assert 0.09 <= time.perf_counter() - began < 1.0


async def test_full_queue_is_a_capacity_error(running: list[asyncio.Task[None]]) -> None:
    engine = FakeEngine(hold_first=True)
    batcher = Batcher(engine, max_batch=8, max_queue=2)
    start(batcher, running)
    # "a" left the queue for the model: two wait, the most there is room for
    tasks = await behind_first(batcher, engine, "a", finals("b") + partials("c"))
    with pytest.raises(CapacityError) as caught:
        await batcher.transcribe(item("d"))
    assert caught.value.retry_after_s > 0
    engine.release.set()
    await asyncio.gather(*tasks)
    assert engine.batches == [["a"], ["b", "c"]]


async def test_a_caller_that_went_away_is_skipped(running: list[asyncio.Task[None]]) -> None:
    engine = FakeEngine(hold_first=True)
    batcher = Batcher(engine, max_batch=8, max_queue=100)
    start(batcher, running)
    first, b, c, d = await behind_first(batcher, engine, "a", finals("b", "c", "d"))
    c.cancel()
    engine.release.set()
    await asyncio.gather(first, b, d)
    assert c.cancelled()
    assert engine.batches == [["a"], ["b", "d"]]


async def test_an_engine_error_reaches_every_waiter_of_that_batch_only(
    running: list[asyncio.Task[None]],
) -> None:
    engine = FakeEngine(hold_first=True, fail_on="boom")
    batcher = Batcher(engine, max_batch=3, max_queue=100)
    start(batcher, running)
    first, *waiting = await behind_first(batcher, engine, "a", finals("b", "boom", "c", "d", "e"))
    doomed, later = waiting[:3], waiting[3:]
    engine.release.set()
    assert (await first).text == "text of a"
    for task in doomed:
        with pytest.raises(RuntimeError, match="engine failed on boom"):
            await task
    assert [(await task).text for task in later] == ["text of d", "text of e"]
    assert engine.batches == [["a"], ["b", "boom", "c"], ["d", "e"]]


# --- the real engine on the tiny random-weight Whisper -------------------------------


@pytest.fixture(scope="module")
def whisper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FasterWhisperEngine]:
    with offline():
        folder = build_tiny_whisper(tmp_path_factory.mktemp("tiny-whisper"))
        engine = FasterWhisperEngine(WhisperSettings(model=str(folder), device="cpu"))
        engine.load()
        yield engine


def _utterances() -> list[AsrInput]:
    rng = np.random.default_rng(7)
    t = np.arange(RATE * 3) / RATE
    tones = [(0.3 * np.sin(2 * np.pi * f * t)).astype(np.float32) for f in (220, 880, 3000)]
    noises = [(rng.standard_normal(RATE * n) * 0.2).astype(np.float32) for n in (1, 2, 5)]
    return [
        AsrInput(tones[0][: RATE // 2]),
        AsrInput(noises[0], "en"),
        AsrInput(tones[1], "de"),
        AsrInput(noises[1]),
        AsrInput(tones[2][: RATE * 2], "fr"),
        AsrInput(noises[2], "ja"),
        AsrInput(np.zeros(RATE, dtype=np.float32), "en"),
    ]


@pytest.fixture
async def batchers(whisper: FasterWhisperEngine) -> AsyncIterator[tuple[Batcher, Batcher]]:
    batched = Batcher(whisper, max_batch=16, max_queue=100)
    single = Batcher(whisper, max_batch=1, max_queue=100)
    tasks = [asyncio.create_task(b.run()) for b in (batched, single)]
    yield batched, single
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_batched_equals_one_at_a_time_through_the_batcher(
    batchers: tuple[Batcher, Batcher],
) -> None:
    batched, single = batchers
    items = _utterances()
    together = await asyncio.gather(*(batched.transcribe(i) for i in items))
    one_by_one = await asyncio.gather(*(single.transcribe(i) for i in items))
    assert batched.batches_run == 1
    assert single.batches_run == len(items)
    assert together == one_by_one
    assert len({t.text for t in together}) > 1


async def test_mixed_modes_give_the_same_transcripts(batchers: tuple[Batcher, Batcher]) -> None:
    batched, single = batchers
    items = _utterances()
    modes: list[Mode] = ["partial" if i % 2 else "final" for i in range(len(items))]
    mixed = await asyncio.gather(
        *(batched.transcribe(i, m) for i, m in zip(items, modes, strict=True))
    )
    reference: list[Any] = [await single.transcribe(i) for i in items]
    assert mixed == reference


def test_tiny_model_fixture_is_offline(whisper: FasterWhisperEngine) -> None:
    assert Path(whisper.model).is_dir()
    assert whisper.device == "cpu"
