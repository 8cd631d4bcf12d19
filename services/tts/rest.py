"""`POST /v1/audio/speech` and `GET /v1/models` (OpenAI-compatible); voices are in voices_api.py.

OpenAI's voice names (`alloy`, `nova`, ...) are accepted and all map to the engine's
default voice; `GET /v1/voices` lists them under `openai_voices`. Any other name must be
one of the engine's voices or a library voice id, else 400. OpenAI's model names
(`tts-1`, `tts-1-hd`, `gpt-4o-mini-tts`) mean the engine this service runs; another
name must be the engine's own (`GET /v1/models`), else 400.

Every format streams: each chunk the engine makes is encoded (services/common/audio/
stream_encoder.py) and sent at once, so the first bytes leave with the first
synthesized piece whether the format is `pcm`, `wav`, `mp3`, `opus`, `aac` or `flac`.
`pcm` is headerless PCM16 at 24 kHz, as OpenAI's. The first chunk is made before the
200 goes out, so capacity and engine errors still become an HTTP error status instead
of a cut-off body. `stream_format: "sse"` sends the same encoded bytes as server-sent
events, as OpenAI defines them: `speech.audio.delta` (base64 `audio`) per chunk, then
`speech.audio.done` with `usage` (this service counts input characters and output
milliseconds of audio there: it has no tokens).
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Annotated, Any, Final, Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from services.common import metrics
from services.common.audio.pcm import AudioF32, media_type, supported_encodings
from services.common.audio.stream_encoder import StreamEncoder, stream_rate
from services.common.auth.guard import principal_of
from services.common.errors import InvalidMessage, UnknownModel
from services.common.protocol.events import NOT_BLANK
from services.tts.synthesizer import Synthesizer

OPENAI_PCM_RATE = 24000
"""OpenAI's `pcm` is headerless PCM16 at 24 kHz: without a header, clients can only assume it."""
OPENAI_MODELS: Final = frozenset(
    {"tts-1", "tts-1-hd", "gpt-4o-mini-tts", "gpt-4o-mini-tts-2025-12-15"}
)
"""OpenAI's speech models: each means the engine this service runs."""


class SpeechBody(BaseModel):
    """The request body of OpenAI's speech endpoint (unknown fields ignored)."""

    model_config = ConfigDict(extra="ignore")

    model: str = "tts-1"
    input: Annotated[str, NOT_BLANK]
    voice: str | dict[str, Any] = "default"
    """An engine voice, `default`, or an OpenAI voice name (mapped to the default voice)."""
    response_format: str = "mp3"
    stream_format: Literal["audio", "sse"] = "audio"
    """`audio`: the encoded bytes as they are made; `sse`: the same as server-sent events."""
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    sample_rate: int | None = Field(default=None, ge=8000, le=48000)
    exaggeration: float | None = Field(default=None, ge=0.0, le=2.0)
    """chatterbox: emotion exaggeration for this request (default from settings)."""
    cfg_weight: float | None = Field(default=None, ge=0.0, le=2.0)
    """chatterbox: classifier-free guidance weight for this request."""
    temperature: float | None = Field(default=None, ge=0.05, le=2.0)
    """chatterbox: sampling temperature for this request."""


def served_models(synthesizer: Synthesizer) -> list[dict[str, Any]]:
    """What `GET /v1/models` lists: the engine this service runs, with its voices."""
    engine = synthesizer.engine
    return [
        {
            "id": engine.name,
            "object": "model",
            "created": 0,
            "owned_by": "voice-agent",
            "task": "text-to-speech",
            "default": True,
            "loaded": True,
            "model": engine.model,
            "voices": engine.voices(),
            "aliases": sorted(OPENAI_MODELS),
        }
    ]


def check_model(synthesizer: Synthesizer, model: str) -> None:
    """UnknownModel (400) unless `model` names this service's engine or an OpenAI model."""
    engine = synthesizer.engine
    if model in OPENAI_MODELS or model in (engine.name, engine.model):
        return
    raise UnknownModel(
        f"unknown model {model!r}; this service serves {engine.name} "
        f"({', '.join(sorted(OPENAI_MODELS))} mean it; see GET /v1/models)"
    )


def router(synthesizer: Synthesizer, max_input_chars: int) -> APIRouter:
    """The REST routes of the TTS service."""
    api = APIRouter()
    formats = supported_encodings()

    @api.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": served_models(synthesizer)}

    @api.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> dict[str, Any]:
        for model in served_models(synthesizer):
            if model_id in (model["id"], model["model"]):
                return model
        raise _NotFound(f"unknown model {model_id!r}; see GET /v1/models")

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
        check_model(synthesizer, body.model)
        voice = body.voice if isinstance(body.voice, str) else str(body.voice.get("id", ""))
        request = synthesizer.request(body.input, voice, body)
        default_rate = OPENAI_PCM_RATE if body.response_format == "pcm" else None
        asked = body.sample_rate or default_rate or synthesizer.engine.sample_rate
        rate = stream_rate(body.response_format, asked)
        chunks = synthesizer.stream(request, rate, tenant)
        try:
            first = await anext(chunks, None)
        except BaseException:
            await chunks.aclose()
            raise
        tally = _Tally(started)
        encoded = _encoded(chunks, first, StreamEncoder(body.response_format, rate), tally)
        if body.stream_format == "sse":
            events = _events(encoded, len(body.input), rate)
            return _CountedStream(events, "text/event-stream", tally)
        return _CountedStream(_bytes(encoded), media_type(body.response_format), tally)

    return api


class _NotFound(UnknownModel):
    code = "model_not_found"
    http_status = 404


class _Tally:
    """`va_requests_total{route="speech"}` for one streamed request, counted once."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.counted = False

    def count(self, outcome: str) -> None:
        """Count `outcome` unless this request is counted already (`error`: the app's error
        handler counts it, services/common/service/routes.py)."""
        if self.counted:
            return
        self.counted = True
        if outcome == "ok":
            duration = time.perf_counter() - self.started
            metrics.REQUEST_DURATION.labels("tts", "speech").observe(duration)
        if outcome != "error":
            metrics.REQUESTS.labels("tts", "speech", outcome).inc()


class _CountedStream(StreamingResponse):
    """A streamed speech body that counts how it ended: `ok` once its last piece is out
    (`_encoded`), `error` when it breaks, `cancelled` when the client hangs up first (as
    the ASR service counts a hang-up). Its body is closed here however it ends: a client
    that hangs up leaves it waiting at a `yield`, where nothing else would close it (and
    stop its synthesis) until it is collected."""

    body_iterator: AsyncGenerator[bytes, None]

    def __init__(self, body: AsyncGenerator[bytes, None], media_type: str, tally: _Tally):
        super().__init__(body, media_type=media_type)
        self.tally = tally

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except ClientDisconnect:  # a server on ASGI spec 2.4 says so
            pass
        except Exception:
            self.tally.count("error")
            raise
        finally:
            await self.body_iterator.aclose()
            self.tally.count("cancelled")  # unless it ended otherwise


async def _encoded(
    chunks: AsyncGenerator[AudioF32, None],
    first: AudioF32 | None,
    encoder: StreamEncoder,
    tally: _Tally,
) -> AsyncGenerator[tuple[bytes, int], None]:
    """(encoded bytes, samples they carry) per chunk, the header with the first; the
    request counts `ok` once the last is made."""
    try:
        async with aclosing(chunks):
            header = await asyncio.to_thread(encoder.start)
            if first is not None:
                data = await asyncio.to_thread(encoder.encode, first)
                yield header + data, first.size
            else:
                yield header, 0
            async for chunk in chunks:
                yield await asyncio.to_thread(encoder.encode, chunk), chunk.size
            yield await asyncio.to_thread(encoder.finish), 0
        tally.count("ok")
    finally:
        encoder.close()


async def _bytes(encoded: AsyncGenerator[tuple[bytes, int], None]) -> AsyncGenerator[bytes, None]:
    async with aclosing(encoded):
        async for data, _ in encoded:
            if data:
                yield data


async def _events(
    encoded: AsyncGenerator[tuple[bytes, int], None], characters: int, rate: int
) -> AsyncGenerator[bytes, None]:
    """OpenAI's speech events: a `speech.audio.delta` per piece, then `speech.audio.done`."""
    samples = 0
    async with aclosing(encoded):
        async for data, count in encoded:
            samples += count
            if data:
                audio = base64.b64encode(data).decode("ascii")
                yield _event({"type": "speech.audio.delta", "audio": audio})
    output = round(1000 * samples / rate)
    usage = {"input_tokens": characters, "output_tokens": output}
    usage["total_tokens"] = characters + output
    yield _event({"type": "speech.audio.done", "usage": usage})


def _event(body: dict[str, Any]) -> bytes:
    return f"event: {body['type']}\ndata: {json.dumps(body)}\n\n".encode()
