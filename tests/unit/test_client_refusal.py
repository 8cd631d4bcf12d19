"""A session the gateway refuses or ends before `session.created` is a `SessionRefused` with
the gateway's error code and close code, not a RuntimeError or a bare ConnectionClosed."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
import websockets
from websockets.asyncio.server import ServerConnection

from services.client.stream import SessionRefused, StreamClient


async def _refuse(ws: ServerConnection) -> None:
    path = ws.request.path if ws.request is not None else ""
    if path == "/full":  # what a draining or full gateway does
        full = {"type": "error", "code": "capacity", "message": "full", "retry_after_s": 10}
        await ws.send(json.dumps(full))
        await ws.close(1013, "at capacity")
    elif path == "/quota":
        await ws.close(1008, "the daily audio quota is used up")
    else:
        await ws.send("not json")


@pytest.fixture
async def refusing() -> AsyncIterator[str]:
    async with websockets.serve(_refuse, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"ws://127.0.0.1:{port}"


@pytest.mark.parametrize(
    ("path", "code", "close_code", "words"),
    [
        ("/full", "capacity", 1013, "refused the session: full"),
        ("/quota", None, 1008, "quota is used up"),
        ("/junk", None, None, "not a voice-agent stream"),
    ],
)
async def test_a_refusal_is_typed(
    refusing: str, path: str, code: str | None, close_code: int | None, words: str
) -> None:
    with pytest.raises(SessionRefused, match=words) as refused:
        async with StreamClient(refusing + path):
            pass
    assert (refused.value.code, refused.value.close_code) == (code, close_code)
    assert refused.value.retry_after_s == (10 if code == "capacity" else None)
