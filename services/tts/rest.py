"""`POST /v1/audio/speech` (OpenAI-compatible); the voice routes are in voices_api.py.

OpenAI's voice names (`alloy`, `nova`, ...) are accepted and all map to the engine's
default voice; `GET /v1/voices` lists them under `openai_voices`. Any other name must be
one of the engine's voices or a library voice id, else 400. `pcm` is headerless PCM16
at 24 kHz, as OpenAI's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from services.common import metrics
from services.common.audio.pcm import encode_audio, float_to_pcm16, media_type, supported_encodings
from services.common.auth.guard import principal_of
from services.common.errors import InvalidMessage
from services.common.protocol.events import NOT_BLANK
from services.tts.engines.base import SpeechRequest
from services.tts.synthesizer import Synthesizer

OPENAI_PCM_RATE = 24000
"""OpenAI's `pcm` is headerless PCM16 at 24 kHz: without a header, clients can only assume it."""


class SpeechBody(BaseModel):
    """The request body of OpenAI's speech endpoint (unknown fields ignored)."""

    model_config = ConfigDict(extra="ignore")

    model: str = "tts-1"
    input: Annotated[str, NOT_BLANK]
    voice: str | dict[str, Any] = "default"
    """An engine voice, `default`, or an OpenAI voice name (mapped to the default voice)."""
    response_format: str = "mp3"
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    sample_rate: int | None = Field(default=None, ge=8000, le=48000)
    exaggeration: float | None = Field(default=None, ge=0.0, le=2.0)
    """chatterbox: emotion exaggeration for this request (default from settings)."""
    cfg_weight: float | None = Field(default=None, ge=0.0, le=2.0)
    """chatterbox: classifier-free guidance weight for this request."""
    temperature: float | None = Field(default=None, ge=0.05, le=2.0)
    """chatterbox: sampling temperature for this request."""


def router(synthesizer: Synthesizer, max_input_chars: int) -> APIRouter:
    """The REST routes of the TTS service."""
    api = APIRouter()
    formats = supported_encodings()

    @api.post("/v1/audio/speech", response_model=None)
    async def speech(body: SpeechBody, http: Request) -> Response:
        tenant = principal_of(http).tenant
        started = time.perf_counter()
        if body.response_format not in formats:
            raise InvalidMessage(
                f"response_format {body.response_format!r} is not supported; "
                f"use one of {', '.join(formats)}"
            )
        if len(body.input) > max_input_chars:
            raise InvalidMessage(f"input exceeds {max_input_chars} characters")
        voice = body.voice if isinstance(body.voice, str) else str(body.voice.get("id", ""))
        request = synthesizer.request(body.input, voice, body)
        default_rate = OPENAI_PCM_RATE if body.response_format == "pcm" else None
        rate = body.sample_rate or default_rate or synthesizer.engine.sample_rate
        if body.response_format == "pcm":
            return await _pcm_response(synthesizer, request, rate, tenant)
        async with aclosing(synthesizer.stream(request, rate, tenant)) as chunks:
            audio = [chunk async for chunk in chunks]
        samples = np.concatenate(audio) if audio else np.zeros(0, np.float32)
        data = await asyncio.to_thread(encode_audio, samples, rate, body.response_format)
        metrics.REQUEST_DURATION.labels("tts", "speech").observe(time.perf_counter() - started)
        metrics.REQUESTS.labels("tts", "speech", "ok").inc()
        return Response(data, media_type=media_type(body.response_format))

    return api


async def _pcm_response(
    synthesizer: Synthesizer, request: SpeechRequest, rate: int, tenant: str
) -> Response:
    """Stream raw PCM; the first chunk is made before the 200 goes out, so capacity and
    engine errors still become an HTTP error status instead of a cut-off body."""
    chunks = synthesizer.stream(request, rate, tenant)
    try:
        first = await anext(chunks)
    except StopAsyncIteration:
        return Response(b"", media_type="audio/pcm")
    except BaseException:
        await chunks.aclose()
        raise

    async def body() -> AsyncIterator[bytes]:
        async with aclosing(chunks):
            yield float_to_pcm16(first)
            async for chunk in chunks:
                yield float_to_pcm16(chunk)

    return StreamingResponse(body(), media_type="audio/pcm")
