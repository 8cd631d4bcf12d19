"""The pure streaming pieces: token chunking, cross-faded joins, the fair model lock."""

from __future__ import annotations

import itertools
import threading
import time

import numpy as np
import pytest

from services.tts.engines.streaming import CrossFader, FairLock, Segment, TokenChunker, fade_in
from tests.turns import TakingTurns


def segments(chunker: TokenChunker, count: int) -> list[Segment]:
    found = [s for s in (chunker.push(t) for t in range(count)) if s is not None]
    last = chunker.finish()
    return [*found, last] if last is not None else found


def bounds(found: list[Segment]) -> list[tuple[int, int, bool]]:
    return [(s.start, s.end, s.final) for s in found]


def test_small_first_chunk_then_regular_chunks_with_context() -> None:
    found = segments(TokenChunker(first=10, size=25, context=8), 60)
    assert bounds(found) == [(0, 10, False), (2, 35, False), (27, 60, False), (52, 60, True)]
    assert found[1].tokens == tuple(range(2, 35))


def test_short_utterance_is_one_final_segment() -> None:
    assert bounds(segments(TokenChunker(10, 25, 8), 6)) == [(0, 6, True)]
    assert segments(TokenChunker(10, 25, 8), 0) == []


def test_context_never_reaches_before_the_start() -> None:
    found = segments(TokenChunker(first=3, size=4, context=100), 10)
    assert all(s.start == 0 for s in found)


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        TokenChunker(0, 25, 8)


def test_fade_in_rises_smoothly() -> None:
    weights = fade_in(100)
    assert weights[0] < 0.001 and weights[-1] > 0.999
    assert np.all(np.diff(weights) > 0)
    assert np.allclose(weights + weights[::-1], 1.0)  # the two sides always sum to one


def sine(start: int, end: int, freq: float = 220.0, rate: int = 24000) -> np.ndarray:
    t = np.arange(start, end) / rate
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def test_identical_renderings_join_exactly() -> None:
    fader = CrossFader(overlap=480)
    out = [
        fader.push(0, sine(0, 5000), final=False),
        fader.push(3000, sine(3000, 9000), final=False),
        fader.push(7000, sine(7000, 12000), final=True),
    ]
    assert [len(o) for o in out] == [4520, 4000, 3480]
    assert np.allclose(np.concatenate(out), sine(0, 12000), atol=1e-6)


def test_cross_fade_goes_from_the_old_rendering_to_the_new() -> None:
    fader = CrossFader(overlap=100)
    first = fader.push(0, np.ones(300, np.float32), final=False)
    second = fader.push(150, np.zeros(300, np.float32), final=True)
    assert np.all(first == 1.0) and first.size == 200
    fade, rest = second[:100], second[100:]
    assert fade[0] > 0.99 and fade[-1] < 0.01 and np.all(np.diff(fade) < 0)
    assert np.all(rest == 0.0) and rest.size == 150


def test_tail_before_the_next_rendering_is_kept_as_is() -> None:
    fader = CrossFader(overlap=100)
    fader.push(0, np.ones(300, np.float32), final=False)  # holds 200..300
    out = fader.push(250, np.zeros(100, np.float32), final=True)
    assert np.all(out[:50] == 1.0)  # 200..250 only the first rendering has
    assert out.size == 150


def test_a_gap_is_filled_with_silence_to_keep_time() -> None:
    fader = CrossFader(overlap=10)
    first = fader.push(0, np.ones(100, np.float32), final=False)
    second = fader.push(120, np.ones(30, np.float32), final=True)
    assert first.size + second.size == 150
    assert np.all(second[10:30] == 0.0)


def test_fair_lock_serves_in_arrival_order() -> None:
    lock = FairLock()
    order: list[int] = []
    lock.__enter__()
    threads = []
    for i in range(5):
        thread = threading.Thread(target=lambda i=i: _take(lock, order, i))
        thread.start()
        threads.append(thread)
        while lock.waiting() < i + 2:  # this thread has its ticket before the next starts
            time.sleep(0.001)
    lock.__exit__(None, None, None)
    for thread in threads:
        thread.join(5)
    assert order == [0, 1, 2, 3, 4]
    assert lock.waiting() == 0


def _take(lock: FairLock, order: list[int], i: int) -> None:
    with lock:
        order.append(i)


def test_fair_lock_alternates_two_busy_threads() -> None:
    """A thread that releases and asks again waits behind one already waiting. Each turn
    is kept until the other thread waits (or is done): the order is the lock's alone."""
    lock = FairLock()
    order: list[str] = []
    turns = TakingTurns(lock)
    start = threading.Barrier(2)

    def worker(name: str) -> None:
        start.wait()
        for _ in range(30):
            with lock:
                order.append(name)
                turns.hold()
        turns.done()

    threads = [threading.Thread(target=worker, args=(n,)) for n in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(order) == ["a"] * 30 + ["b"] * 30
    assert all(x != y for x, y in itertools.pairwise(order)), order
