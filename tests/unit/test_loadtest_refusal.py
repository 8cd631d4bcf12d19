"""A simulated user the gateway refuses before `session.created` counts the refusal by its
close code, as docs/loadtest.md says: `closed_1013` at capacity, not `connect_failed`."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import numpy as np
import pytest
import websockets
from websockets.asyncio.server import ServerConnection

from services.client.stream import SessionRefused
from services.loadtest.corpus import Utterance
from services.loadtest.user import Live, User, UserPlan, Window, _refusal_code


async def _refuse(ws: ServerConnection) -> None:
    path = ws.request.path if ws.request is not None else ""
    if path == "/full":  # what a gateway at capacity does (services/gateway admission)
        await ws.send(json.dumps({"type": "error", "code": "capacity", "message": "full"}))
        await ws.close(1013, "gateway at capacity, retry after 10 s")
    else:  # a quota used up: closed before any message
        await ws.close(1008, "the daily audio quota is used up")


@pytest.fixture
async def refusing() -> AsyncIterator[str]:
    async with websockets.serve(_refuse, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"ws://127.0.0.1:{port}"


@pytest.mark.parametrize(("path", "counted"), [("/full", "closed_1013"), ("/quota", "closed_1008")])
async def test_a_refused_session_is_counted_by_its_close_code(
    refusing: str, path: str, counted: str
) -> None:
    plan = UserPlan(refusing + path, (Utterance("x", np.zeros(1600, np.float32), None),))
    live = Live()
    run = await User(plan, Window(time.monotonic(), 0.0, 1.0, 1), 0, live).run()
    assert run.connect_error == counted
    assert live.failures == 1 and run.turns == []


def test_a_refusal_without_a_close_code_is_counted_by_its_error_code() -> None:
    assert _refusal_code(SessionRefused("x", code="capacity")) == "capacity"
    assert _refusal_code(SessionRefused("x", code="capacity", close_code=1013)) == "closed_1013"
    assert _refusal_code(SessionRefused("not a voice-agent stream")) == "connect_failed"
