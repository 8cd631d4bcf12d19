"""ReadAhead: a socket read ahead of its handling, bounded, ended by the peer's leaving."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from services.common.service.ws import Channel, Disconnected, Frame, ReadAhead


class _Socket:
    """Frames, then the peer leaves."""

    def __init__(self, frames: list[Frame]) -> None:
        self.frames = frames

    async def receive(self) -> Frame:
        if not self.frames:
            raise Disconnected
        return self.frames.pop(0)


async def test_the_peers_leaving_ends_the_handling_whatever_is_queued() -> None:
    frames = ReadAhead(max_bytes=1 << 20)
    await frames.read(cast(Channel, _Socket([Frame(text="a"), Frame(data=b"\0\0")])))
    with pytest.raises(Disconnected):  # not the two frames read before the close
        await frames.get()


async def test_a_client_faster_than_its_handling_is_held_at_the_bound() -> None:
    frames = ReadAhead(max_bytes=4)
    await frames.put(Frame(data=b"1234"))
    held = asyncio.create_task(frames.put(Frame(data=b"56")))
    await asyncio.sleep(0)
    assert not held.done()  # 6 bytes would pass the bound
    assert (await frames.get()).data == b"1234"
    await asyncio.wait_for(held, 1)
    assert (await frames.get()).data == b"56"
    await frames.put(Frame(data=b"x" * 10))  # one frame past the bound still goes in alone
    assert len(cast(Any, (await frames.get()).data)) == 10
