"""The ASR service: `create_app(settings)` wires engine, batcher, transports and ops routes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Query, WebSocket

from services.asr.consumer import AsrJobHandler
from services.asr.engines import create_engine
from services.asr.engines.base import AsrEngine
from services.asr.engines.catalog import PACKAGED
from services.asr.models import AsrModels, discovered
from services.asr.rest import router
from services.asr.settings import AsrSection, AsrSettings
from services.asr.stream import serve_asr_stream
from services.common.audio.listener import HearingBatcher
from services.common.audio.vad import SileroVad
from services.common.auth.tokens_api import install_auth
from services.common.body_limit import BodyLimit
from services.common.bus.connection import connect
from services.common.bus.keys import Keys
from services.common.bus.streams import JobStream, consumed_shards, unique_consumer_name
from services.common.bus.worker import JobWorker
from services.common.platform.devices import cuda_index
from services.common.platform.threads import limit_blas_threads
from services.common.service.lifecycle import Background
from services.common.service.routes import ServiceState, install_ops

log = logging.getLogger(__name__)


def create_app(settings: AsrSettings, engine: AsrEngine | None = None) -> FastAPI:
    """The ASR app. The model loads in `lifespan`, never at import."""
    limit_blas_threads(settings.blas_threads)
    section = settings.asr
    engine = engine or create_engine(section)
    redis = connect(settings.redis)
    keys = Keys(settings.redis.prefix, settings.redis.shards)
    models = AsrModels(
        section,
        engine,
        lambda name: create_engine(_with_model(section, name)),
        _discover(section),
    )
    batcher = models.default_batcher
    state = ServiceState(
        service="asr",
        redis=redis,
        engine=engine.name,
        model=engine.model,
        device=engine.device,
        gpu_index=cuda_index(engine.device),
        queue_depth=models.depth,
    )
    hearing: dict[str, HearingBatcher] = {}  # the VAD of every stream, batched off the loop
    background = Background()
    state.background_ok = background.healthy

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await models.start()
        state.device, state.gpu_index = engine.device, cuda_index(engine.device)
        vad = await asyncio.to_thread(SileroVad, settings.vad.model_path)  # VA_VAD__MODEL_PATH
        hearing["vad"] = HearingBatcher(vad)
        state.model_loaded = True
        consumer = unique_consumer_name("asr")
        handler = AsrJobHandler(batcher, redis, settings.redis, section.max_utterance_s)
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
            background.start(worker.run, f"asr-worker-{index}")
        log.info(
            "ASR ready: engine=%s model=%s device=%s", engine.name, engine.model, engine.device
        )
        try:
            yield
        finally:
            state.draining = True
            # all at once: each stops taking jobs now, and the wait is one timeout, not one each
            await asyncio.gather(*(w.drain(section.server.drain_timeout_s) for w in workers))
            await background.stop()
            await models.stop()
            hearing["vad"].close()
            await redis.aclose()

    app = FastAPI(title="voice-agent ASR", lifespan=lifespan)
    install_ops(app, state)
    install_auth(app, settings.auth, redis, settings.redis.prefix, "asr")
    max_upload = int(section.max_upload_mb * 1024 * 1024)
    app.include_router(router(models, max_upload, section.max_file_s))
    doors = ("/v1/audio/transcriptions", "/v1/audio/translations")
    app.add_middleware(BodyLimit, limits=dict.fromkeys(doors, max_upload))

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
    app.state.models = models
    return app


def _with_model(section: AsrSection, name: str) -> AsrSection:
    """The section with `name` as its Whisper model (another model of the same process)."""
    whisper = section.whisper.model_copy(update={"model": name})
    return section.model_copy(update={"whisper": whisper})


def _discover(section: AsrSection) -> Callable[[], list[str]] | None:
    """Installed models are found only for faster-whisper (the fake engine has one)."""
    if section.engine != "faster-whisper":
        return None
    return lambda: discovered(section.whisper.models_dir, dict(PACKAGED))
