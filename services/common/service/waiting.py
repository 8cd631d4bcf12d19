"""Waiting on an event with a deadline, without losing a cancellation.

Python 3.11's `asyncio.wait_for` returns the awaited result when the waiting task is
cancelled in the same loop turn as the event is set (the cancellation is swallowed; fixed
in 3.12, where it is built on `asyncio.timeout`). A gateway playout loop that lost its
cancellation that way kept a closed session alive for the length of its reply (the close
e2e test caught it under load). `asyncio.timeout` does not lose it.
"""

from __future__ import annotations

import asyncio


async def set_within(event: asyncio.Event, timeout_s: float) -> bool:
    """Whether `event` is set within `timeout_s` (False: the time ran out). A cancellation
    of the caller is always raised, even one that lands as the event is set."""
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    return True
