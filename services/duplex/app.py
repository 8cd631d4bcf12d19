"""The duplex service: `create_app(settings)` wires engine, stepper, both WebSocket protocols
and the ops routes. The model loads in `lifespan`, never at import."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Query, WebSocket

from services.common.auth.tokens_api import install_auth
from services.common.bus.connection import connect
from services.common.platform.devices import cuda_index
from services.common.platform.threads import limit_blas_threads
from services.common.service.lifecycle import Background
from services.common.service.routes import ServiceState, install_ops
from services.duplex import metrics
from services.duplex.engines import create_engine
from services.duplex.engines.base import DuplexEngine
from services.duplex.moshi_chat import serve_moshi_chat
from services.duplex.pcm import serve_pcm_stream
from services.duplex.settings import DuplexSettings
from services.duplex.stepper import Stepper

log = logging.getLogger(__name__)


def create_app(settings: DuplexSettings, engine: DuplexEngine | None = None) -> FastAPI:
    """The duplex app: `max_sessions` slots stepped together by one model."""
    limit_blas_threads(settings.blas_threads)
    section = settings.duplex
    engine = engine or create_engine(section)
    redis = connect(settings.redis)
    stepper = Stepper(
        engine,
        section.max_sessions,
        section.gather_ms,
        section.max_input_frames,
        section.max_output_frames,
        section.retry_after_s,
    )
    state_bytes = {"per_slot": 0}

    def extra() -> dict[str, Any]:
        return {
            "sessions": stepper.live,
            "max_sessions": section.max_sessions,
            "steps": stepper.steps,
            "state_bytes_per_slot": state_bytes["per_slot"],
        }

    state = ServiceState(
        service="duplex",
        redis=redis,
        engine=engine.name,
        model=engine.model,
        device=engine.device,
        gpu_index=cuda_index(engine.device),
        queue_depth=stepper.depth,
        extra=extra,
    )
    background = Background()
    state.background_ok = background.healthy

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(engine.load, section.max_sessions)
        state.device, state.gpu_index = engine.device, cuda_index(engine.device)
        state_bytes["per_slot"] = engine.state_bytes_per_slot()
        metrics.SLOTS.set(section.max_sessions)
        metrics.STATE_BYTES.set(state_bytes["per_slot"])
        state.model_loaded = True
        background.start(stepper.run, "duplex-stepper")
        log.info(
            "duplex ready: engine=%s model=%s device=%s slots=%d",
            engine.name,
            engine.model,
            engine.device,
            section.max_sessions,
        )
        try:
            yield
        finally:
            state.draining = stepper.draining = True
            await background.stop()
            await redis.aclose()

    app = FastAPI(title="voice-agent duplex", lifespan=lifespan)
    install_ops(app, state)
    install_auth(app, settings.auth, redis, settings.redis.prefix, "duplex")
    max_frame = section.server.ws_max_frame_bytes

    @app.websocket("/v1/stream/duplex")
    async def duplex_stream(
        ws: WebSocket,
        input_sample_rate: int = Query(24000),
        output_sample_rate: int = Query(24000),
    ) -> None:
        await serve_pcm_stream(ws, state, stepper, max_frame, input_sample_rate, output_sample_rate)

    @app.websocket("/api/chat")
    async def moshi_chat(ws: WebSocket) -> None:
        await serve_moshi_chat(ws, state, stepper, max_frame)

    app.state.stepper = stepper
    return app
