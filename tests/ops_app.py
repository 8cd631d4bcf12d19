"""A small real service for ops tests: only /health, /ready and /metrics, on a real Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from services.common.bus.connection import connect
from services.common.bus.settings import RedisSettings
from services.common.service.routes import ServiceState, install_ops


def ops_app(service: str, redis: RedisSettings, engine: str = "fake") -> FastAPI:
    """An app that reports like `service` (model loaded) and nothing more."""
    client = connect(redis)
    state = ServiceState(service, client, engine=engine, model="none", model_loaded=True)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await client.aclose()

    app = FastAPI(lifespan=lifespan)
    install_ops(app, state)
    return app
