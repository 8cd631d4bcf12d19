"""Run one service under uvicorn with the settings the environment gives."""

from __future__ import annotations

import argparse
import importlib
import logging
from typing import Any

import uvicorn

from services.common.settings import BaseServiceSettings, ServerSettings

# service name → (settings class, app factory, settings section holding `server`)
SERVICES: dict[str, tuple[str, str, str]] = {
    "asr": ("services.asr.settings:AsrSettings", "services.asr.app:create_app", "asr"),
    "tts": ("services.tts.settings:TtsSettings", "services.tts.app:create_app", "tts"),
    "gateway": (
        "services.gateway.settings:GatewaySettings",
        "services.gateway.app:create_app",
        "gateway",
    ),
}


def _load(path: str) -> Any:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def load_settings(service: str) -> BaseServiceSettings:
    """The service's settings, read from the environment (`VA_...`)."""
    settings_cls = _load(SERVICES[service][0])
    settings: BaseServiceSettings = settings_cls()
    return settings


def server_section(settings: BaseServiceSettings, service: str) -> ServerSettings:
    """The `server` section of a service's settings."""
    section: ServerSettings = getattr(settings, SERVICES[service][2]).server
    return section


def uvicorn_config(app: Any, server: ServerSettings, log_level: str) -> uvicorn.Config:
    """uvicorn settings every service shares: websockets with a frame cap, no deflate."""
    return uvicorn.Config(
        app,
        host=server.host,
        port=server.port,
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


def run_service(service: str, argv: list[str] | None = None) -> None:
    """Parse `--host/--port`, build the app and serve until interrupted."""
    parser = argparse.ArgumentParser(prog=f"voice-agent {service}")
    parser.add_argument("--host", help="bind address (default from settings)")
    parser.add_argument("--port", type=int, help="TCP port (default from settings)")
    args = parser.parse_args(argv)
    settings = load_settings(service)
    server = server_section(settings, service)
    if args.host:
        server.host = args.host
    if args.port:
        server.port = args.port
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    app = _load(SERVICES[service][1])(settings)
    uvicorn.Server(uvicorn_config(app, server, settings.log_level)).run()
