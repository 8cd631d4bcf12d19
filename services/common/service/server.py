"""Serve one service's app under uvicorn: what every service's `server.py` shares.

The service passes in its own settings class and app factory, so this module imports no
service (the layering rule: `services.common` sits below every service).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import uvicorn
from pydantic import ValidationError

from services.common.auth.credentials import exposure_problem
from services.common.redact import install_redaction
from services.common.service.settings import (
    BaseServiceSettings,
    ServerSettings,
    settings_problem,
)
from services.common.service.upgrade import KeepUpgradeTail

S = TypeVar("S", bound=BaseServiceSettings)
log = logging.getLogger(__name__)


def uvicorn_config(app: Any, server: ServerSettings, log_level: str) -> uvicorn.Config:
    """uvicorn settings every service shares: websockets with a frame cap, no deflate."""
    return uvicorn.Config(
        app,
        host=server.host,
        port=server.port,
        http=KeepUpgradeTail,  # a client's first frames sent with its handshake are kept
        ws="websockets-sansio",
        ws_max_size=server.ws_max_frame_bytes,
        ws_per_message_deflate=False,
        ws_ping_interval=20.0,
        ws_ping_timeout=20.0,
        timeout_graceful_shutdown=int(server.drain_timeout_s),
        log_level=log_level,
        access_log=False,
        lifespan="on",
    )


class StoppingServer(uvicorn.Server):
    """uvicorn's server, running the app's own stop (`on_stop`: the gateway's drain) when a
    signal asks it to exit, before uvicorn's shutdown: that one closes every WebSocket at
    once (1012), where the app would let the work in flight finish first.

    The listening sockets close first: a load balancer sends new connections to another
    process while the open ones finish here. A second Ctrl-C cuts the stop short."""

    def __init__(
        self, config: uvicorn.Config, on_stop: Callable[[], Awaitable[object]] | None = None
    ) -> None:
        super().__init__(config)
        self.on_stop = on_stop

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.on_stop is not None and not self.force_exit:
            for server in self.servers:
                server.close()
            await self._stop_app(self.on_stop)
        await super().shutdown(sockets)

    async def _stop_app(self, on_stop: Callable[[], Awaitable[object]]) -> None:
        async def run() -> None:
            await on_stop()

        stopping = asyncio.create_task(run(), name="on-stop")
        while not stopping.done():
            await asyncio.wait({stopping}, timeout=0.1)
            if self.force_exit:
                stopping.cancel()
        if not stopping.cancelled() and stopping.exception() is not None:
            log.error("stopping the app failed", exc_info=stopping.exception())


def run_service(
    name: str,
    settings_cls: type[S],
    create_app: Callable[[S], Any],
    server_of: Callable[[S], ServerSettings],
    argv: list[str] | None = None,
    on_stop: Callable[[Any], Awaitable[object]] | None = None,
) -> None:
    """Parse `--host/--port`, read the settings from the environment, serve until stopped.

    `on_stop(app)` runs when SIGTERM or Ctrl-C asks the server to stop, before uvicorn
    closes the connections (StoppingServer)."""
    parser = argparse.ArgumentParser(prog=f"voice-agent {name}")
    parser.add_argument("--host", help="bind address (default from settings)")
    parser.add_argument("--port", type=int, help="TCP port (default from settings)")
    args = parser.parse_args(argv)
    try:
        settings = settings_cls()
    except ValidationError as exc:
        raise SystemExit(f"voice-agent {name}: bad setting: {settings_problem(exc)}") from None
    server = server_of(settings)
    if args.host:
        server.host = args.host
    if args.port:
        server.port = args.port
    problem = exposure_problem(settings.auth, server.host)
    if problem:
        raise SystemExit(f"voice-agent {name}: {problem}")
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    app = create_app(settings)
    config = uvicorn_config(app, server, settings.log_level)
    install_redaction()  # after uvicorn configured its loggers and handlers
    StoppingServer(config, None if on_stop is None else lambda: on_stop(app)).run()
