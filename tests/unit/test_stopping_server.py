"""The server's stop: the app's own stop (the gateway's drain) runs before uvicorn closes
the connections, after the listening socket has closed; a second Ctrl-C cuts it short."""

from __future__ import annotations

import asyncio

import pytest
import uvicorn

from services.common.service.server import StoppingServer


async def _app(scope: object, receive: object, send: object) -> None:
    """Never called: no request is made."""


async def test_a_second_interrupt_cuts_the_apps_stop_short() -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def on_stop() -> None:
        started.set()
        try:
            await asyncio.Event().wait()  # a drain that would wait for ever
        except asyncio.CancelledError:
            cancelled.set()
            raise

    server = StoppingServer(uvicorn.Config(_app), on_stop)
    stopping = asyncio.create_task(server._stop_app(on_stop))
    await started.wait()
    assert not stopping.done()
    server.force_exit = True  # what uvicorn's handler does on a second SIGINT
    await asyncio.wait_for(stopping, 5)
    assert cancelled.is_set()


async def test_a_failing_stop_is_logged_and_the_shutdown_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def on_stop() -> None:
        raise RuntimeError("drain broke")

    server = StoppingServer(uvicorn.Config(_app), on_stop)
    await asyncio.wait_for(server._stop_app(on_stop), 5)  # no exception escapes
    assert "stopping the app failed" in caplog.text
