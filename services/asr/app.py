"""The ASR service: `create_app(settings)` wires engine, batcher, transports and ops routes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Query, WebSocket

from services.asr.batcher import Batcher
from services.asr.consumer import AsrJobHandler
from services.asr.engines import create_engine
from services.asr.engines.base import AsrEngine
from services.asr.rest import router
from services.asr.settings import AsrSettings
from services.asr.stream import serve_asr_stream
from services.common.audio.listener import HearingBatcher
from services.common.audio.vad import SileroVad
from services.common.auth.tokens_api import install_auth
from services.common.bus.connection import connect
from services.common.bus.keys import Keys
from services.common.bus.streams import JobStream, consumed_shards, unique_consumer_name
from services.common.bus.worker import JobWorker
from services.common.platform.devices import cuda_index
from services.common.service.lifecycle import Background
from services.common.service.routes import ServiceState, install_ops

log = logging.getLogger(__name__)


def create_app(settings: AsrSettings, engine: AsrEngine | None = None) -> FastAPI:
    """The ASR app. The model loads in `lifespan`, never at import."""
    section = settings.asr
    engine = engine or create_engine(section)
    redis = connect(settings.redis)
    keys = Keys(settings.redis.prefix, settings.redis.shards)
    batcher = Batcher(engine, section.max_batch, section.max_queue, section.max_wait_ms)
    state = ServiceState(
        service="asr",
        redis=redis,
        engine=engine.name,
        model=engine.model,
        device=engine.device,
        gpu_index=cuda_index(engine.device),
        queue_depth=batcher.depth,
    )
    hearing: dict[str, HearingBatcher] = {}  # the VAD of every stream, batched off the loop
    background = Background()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(engine.load)
        state.device, state.gpu_index = engine.device, cuda_index(engine.device)
        hearing["vad"] = HearingBatcher(await asyncio.to_thread(SileroVad))
        state.model_loaded = True
        background.start(batcher.run(), "asr-batcher")
        consumer = unique_consumer_name("asr")
        handler = AsrJobHandler(batcher, redis, settings.redis)
        shards = consumed_shards(settings.redis)
        per_shard = -(-section.consumers // len(shards))  # the slots split over the shards
        workers = [
            JobWorker(
                JobStream(redis, settings.redis, keys.jobs("asr", lane, shard), "asr", consumer),
                keys,
                handler,
                per_shard,
            )
            for lane in ("final", "partial")
            for shard in shards
        ]
        for index, worker in enumerate(workers):
            background.start(worker.run(), f"asr-worker-{index}")
        log.info(
            "ASR ready: engine=%s model=%s device=%s", engine.name, engine.model, engine.device
        )
        try:
            yield
        finally:
            state.draining = True
            for worker in workers:
                await worker.drain(section.server.drain_timeout_s)
            await background.stop()
            hearing["vad"].close()
            await redis.aclose()

    app = FastAPI(title="voice-agent ASR", lifespan=lifespan)
    install_ops(app, state)
    install_auth(app, settings.auth, redis, settings.redis.prefix, "asr")
    app.include_router(router(batcher, int(section.max_upload_mb * 1024 * 1024)))

    @app.websocket("/v1/stream/asr")
    async def asr_stream(
        ws: WebSocket,
        sample_rate: int = Query(16000),
        language: str | None = Query(None, max_length=16),
        partials: bool = Query(True),
    ) -> None:
        await serve_asr_stream(
            ws,
            state,
            batcher,
            hearing["vad"],
            settings.vad,
            section.server.ws_max_frame_bytes,
            sample_rate,
            language or None,  # `language=` (empty) is no language, as on the REST door
            partials,
            section.speculative_finals,
        )

    app.state.batcher = batcher
    return app
