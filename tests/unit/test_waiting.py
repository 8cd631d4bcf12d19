"""`set_within`: a deadline on an event that never swallows the caller's cancellation.

The race that Python 3.11's `asyncio.wait_for` loses: the event is set and the waiting
task cancelled in the same loop turn (a TTS chunk arriving as the session closes). The
gateway's playout loop then went on playing a closed session's reply for its whole length.
"""

from __future__ import annotations

import asyncio

import pytest

from services.common.service.waiting import set_within


async def test_set_in_time_is_true_and_a_timeout_is_false() -> None:
    event = asyncio.Event()
    asyncio.get_running_loop().call_soon(event.set)
    assert await set_within(event, 5.0) is True
    assert await set_within(asyncio.Event(), 0.01) is False


async def test_a_cancellation_that_lands_as_the_event_is_set_is_not_swallowed() -> None:
    event = asyncio.Event()
    rounds = 0

    async def playout() -> None:  # the shape of Reply._play: wait for audio, play it, again
        nonlocal rounds
        while True:
            event.clear()
            rounds += 1
            await set_within(event, 30.0)

    task = asyncio.create_task(playout())
    await asyncio.sleep(0)  # it waits on the event now
    event.set()
    task.cancel()  # the same turn: the event's waiter is done when the cancellation lands
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(asyncio.shield(task), 2.0)
    assert task.cancelled() and rounds == 1


async def test_the_old_wait_for_lost_that_cancellation_on_this_python() -> None:
    """The defect itself, so the test above is known to test something (3.11 only)."""
    import sys

    if sys.version_info >= (3, 12):
        pytest.skip("asyncio.wait_for keeps the cancellation from 3.12")
    event = asyncio.Event()

    async def old_wait() -> bool:
        await asyncio.wait_for(event.wait(), 30.0)
        return True

    task = asyncio.create_task(old_wait())
    await asyncio.sleep(0)
    event.set()
    task.cancel()
    assert await task is True  # swallowed: the task ran on as if never cancelled
