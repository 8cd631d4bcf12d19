"""`POST /v1/audio/speech` (OpenAI-compatible) and `GET /v1/voices`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import numpy as np
from fastapi import APIRouter
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from services.common import metrics
from services.common.audio import encode_audio, float_to_pcm16, media_type, supported_encodings
from services.common.errors import InvalidMessage
from services.tts.engines.base import SpeechRequest
from services.tts.synthesizer import Synthesizer


class SpeechBody(BaseModel):
    """The request body of OpenAI's speech endpoint (unknown fields ignored)."""

    model_config = ConfigDict(extra="ignore")

    model: str = "tts-1"
    input: str = Field(min_length=1)
    voice: str | dict[str, Any] = "default"
    response_format: str = "mp3"
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    sample_rate: int | None = Field(default=None, ge=8000, le=48000)


def router(synthesizer: Synthesizer, max_input_chars: int) -> APIRouter:
    """The REST routes of the TTS service."""
    api = APIRouter()
    formats = supported_encodings()

    @api.post("/v1/audio/speech", response_model=None)
    async def speech(body: SpeechBody) -> Response:
        started = time.perf_counter()
        if body.response_format not in formats:
            raise InvalidMessage(
                f"response_format {body.response_format!r} is not supported; "
                f"use one of {', '.join(formats)}"
            )
        if len(body.input) > max_input_chars:
            raise InvalidMessage(f"input exceeds {max_input_chars} characters")
        voice = body.voice if isinstance(body.voice, str) else str(body.voice.get("id", ""))
        request = SpeechRequest(
            text=body.input, voice=synthesizer.resolve_voice(voice), speed=body.speed
        )
        rate = body.sample_rate or synthesizer.engine.sample_rate
        if body.response_format == "pcm":
            return StreamingResponse(
                _pcm_stream(synthesizer, request, rate), media_type="audio/pcm"
            )
        async with aclosing(synthesizer.stream(request, rate)) as chunks:
            audio = [chunk async for chunk in chunks]
        samples = np.concatenate(audio) if audio else np.zeros(0, np.float32)
        data = await asyncio.to_thread(encode_audio, samples, rate, body.response_format)
        metrics.REQUEST_DURATION.labels("tts", "speech").observe(time.perf_counter() - started)
        metrics.REQUESTS.labels("tts", "speech", "ok").inc()
        return Response(data, media_type=media_type(body.response_format))

    @api.get("/v1/voices")
    async def voices() -> dict[str, Any]:
        engine = synthesizer.engine
        return {
            "default": engine.default_voice,
            "voices": [{"id": v, "engine": engine.name} for v in engine.voices()],
        }

    return api


async def _pcm_stream(
    synthesizer: Synthesizer, request: SpeechRequest, rate: int
) -> AsyncIterator[bytes]:
    async with aclosing(synthesizer.stream(request, rate)) as chunks:
        async for chunk in chunks:
            yield float_to_pcm16(chunk)
