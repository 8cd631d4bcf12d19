"""The TTS service: `create_app(settings)` wires engine, synthesizer, transports, ops routes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, WebSocket

from services.common.auth.tokens_api import install_auth
from services.common.body_limit import BodyLimit, json_body_limit
from services.common.bus.connection import connect
from services.common.bus.keys import Keys
from services.common.bus.streams import JobStream, consumed_shards, unique_consumer_name
from services.common.bus.worker import JobWorker
from services.common.errors import BodyTooLarge
from services.common.platform.devices import cuda_index
from services.common.platform.threads import limit_blas_threads
from services.common.service.lifecycle import Background
from services.common.service.routes import ServiceState, install_ops
from services.tts.consumer import TtsJobHandler
from services.tts.engines import create_engine
from services.tts.engines.base import TtsEngine
from services.tts.rest import router
from services.tts.settings import TtsSettings
from services.tts.stream import serve_tts_stream
from services.tts.synthesizer import Synthesizer
from services.tts.voices import VoiceLibrary
from services.tts.voices_api import router as voices_router

log = logging.getLogger(__name__)


def create_app(settings: TtsSettings, engine: TtsEngine | None = None) -> FastAPI:
    """The TTS app. The model loads in `lifespan`, never at import."""
    limit_blas_threads(settings.blas_threads)
    section = settings.tts
    engine = engine or create_engine(section)
    redis = connect(settings.redis)
    keys = Keys(settings.redis.prefix, settings.redis.shards)
    library = VoiceLibrary(redis, settings.redis.prefix, section.voices)
    synthesizer = Synthesizer(
        engine, section.max_concurrent, section.max_queue, section.chunk_ms, library
    )
    state = ServiceState(
        service="tts",
        redis=redis,
        engine=engine.name,
        model=engine.model,
        device=engine.device,
        gpu_index=cuda_index(engine.device),
        queue_depth=synthesizer.depth,
        extra=lambda: {"active_syntheses": synthesizer.active},
    )
    background = Background()
    state.background_ok = background.healthy

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(engine.load)
        state.device, state.gpu_index = engine.device, cuda_index(engine.device)
        state.model_loaded = True
        consumer = unique_consumer_name("tts")
        handler = TtsJobHandler(synthesizer, redis, settings.redis, keys)
        shards = consumed_shards(settings.redis)
        # one job waiting per synthesis slot, so a slot never idles while Redis is read
        per_shard = -(-2 * section.max_concurrent // len(shards))
        workers = [
            JobWorker(
                JobStream(redis, settings.redis, keys.jobs("tts", "final", shard), "tts", consumer),
                keys,
                handler,
                per_shard,
            )
            for shard in shards
        ]
        for index, worker in enumerate(workers):
            background.start(worker.run, f"tts-worker-{index}")
        log.info(
            "TTS ready: engine=%s model=%s device=%s", engine.name, engine.model, engine.device
        )
        try:
            yield
        finally:
            state.draining = True
            # all at once: each stops taking jobs now, and the wait is one timeout, not one each
            await asyncio.gather(*(w.drain(section.server.drain_timeout_s) for w in workers))
            await background.stop()
            await redis.aclose()

    app = FastAPI(title="voice-agent TTS", lifespan=lifespan)
    install_ops(app, state)
    install_auth(app, settings.auth, redis, settings.redis.prefix, "tts")
    app.include_router(router(synthesizer, section.max_input_chars))
    app.include_router(voices_router(synthesizer, library))
    app.add_middleware(BodyLimit, limits={"/v1/voices": section.voices.max_upload_bytes})
    speech = {"/v1/audio/speech": json_body_limit(section.max_input_chars)}
    app.add_middleware(
        BodyLimit, limits=speech, margin=0, what="the request body", error=BodyTooLarge
    )

    @app.websocket("/v1/stream/tts")
    async def tts_stream(ws: WebSocket) -> None:
        await serve_tts_stream(
            ws,
            state,
            synthesizer,
            engine.sample_rate,
            section.server.ws_max_frame_bytes,
            section.max_input_chars,
        )

    app.state.synthesizer = synthesizer
    return app
