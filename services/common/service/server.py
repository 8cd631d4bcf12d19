"""Serve one service's app under uvicorn: what every service's `server.py` shares.

The service passes in its own settings class and app factory, so this module imports no
service (the layering rule: `services.common` sits below every service).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import uvicorn

from services.common.auth.credentials import exposure_problem
from services.common.auth.redact import install_redaction
from services.common.service.settings import BaseServiceSettings, ServerSettings
from services.common.service.upgrade import KeepUpgradeTail

S = TypeVar("S", bound=BaseServiceSettings)


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


def run_service(
    name: str,
    settings_cls: type[S],
    create_app: Callable[[S], Any],
    server_of: Callable[[S], ServerSettings],
    argv: list[str] | None = None,
) -> None:
    """Parse `--host/--port`, read the settings from the environment, serve until stopped."""
    parser = argparse.ArgumentParser(prog=f"voice-agent {name}")
    parser.add_argument("--host", help="bind address (default from settings)")
    parser.add_argument("--port", type=int, help="TCP port (default from settings)")
    args = parser.parse_args(argv)
    settings = settings_cls()
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
    config = uvicorn_config(create_app(settings), server, settings.log_level)
    install_redaction()  # after uvicorn configured its loggers and handlers
    uvicorn.Server(config).run()
