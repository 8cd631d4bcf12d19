"""`POST /v1/audio/transcriptions`, compatible with OpenAI's API and its Python SDK."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from services.asr.batcher import Batcher
from services.asr.engines.base import AsrInput, Transcript
from services.common import metrics
from services.common.audio.pcm import decode_file
from services.common.auth.guard import meter_of
from services.common.errors import InvalidAudio, InvalidMessage

ResponseFormat = Literal["json", "text", "verbose_json", "srt", "vtt"]


class UploadTooLarge(InvalidAudio):
    """An upload over `max_upload_mb`: HTTP 413, as OpenAI answers."""

    http_status = 413


def _timestamp(seconds: float, sep: str) -> str:
    ms = round(seconds * 1000)
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def render(transcript: Transcript, fmt: ResponseFormat, language: str | None) -> Response:
    """The response in the requested format."""
    text, end = transcript.text, transcript.duration_s
    if fmt == "text":
        return PlainTextResponse(text)
    if fmt == "srt":
        return PlainTextResponse(f"1\n{_timestamp(0, ',')} --> {_timestamp(end, ',')}\n{text}\n")
    if fmt == "vtt":
        cue = f"{_timestamp(0, '.')} --> {_timestamp(end, '.')}"
        return PlainTextResponse(f"WEBVTT\n\n{cue}\n{text}\n", media_type="text/vtt")
    if fmt == "json":
        return JSONResponse({"text": text})
    body: dict[str, Any] = {
        "task": "transcribe",
        "language": transcript.language or language or "en",
        "duration": round(end, 3),
        "text": text,
        "segments": [
            {
                "id": 0,
                "seek": 0,
                "start": 0.0,
                "end": round(end, 3),
                "text": text,
                "tokens": [],
                "temperature": 0.0,
                "avg_logprob": 0.0,
                "compression_ratio": 1.0,
                "no_speech_prob": 0.0,
            }
        ]
        if text
        else [],
    }
    return JSONResponse(body)


def router(batcher: Batcher, max_upload_bytes: int) -> APIRouter:
    """The REST routes of the ASR service."""
    api = APIRouter()

    @api.post("/v1/audio/transcriptions", response_model=None)
    async def transcriptions(
        request: Request,
        file: Annotated[UploadFile, File()],
        model: Annotated[str, Form()] = "whisper-1",
        language: Annotated[str | None, Form(max_length=16)] = None,
        prompt: Annotated[str | None, Form()] = None,
        response_format: Annotated[str, Form()] = "json",
        temperature: Annotated[float, Form(ge=0.0, le=1.0)] = 0.0,
    ) -> Response:
        started = time.perf_counter()
        if response_format not in ("json", "text", "verbose_json", "srt", "vtt"):
            raise InvalidMessage(
                f"response_format {response_format!r} is not supported; "
                "use json, text, verbose_json, srt or vtt"
            )
        data = await file.read(max_upload_bytes + 1)
        if len(data) > max_upload_bytes:
            raise UploadTooLarge(f"the upload exceeds the limit of {max_upload_bytes} bytes")
        audio = await asyncio.to_thread(decode_file, data, batcher.engine.sample_rate)
        meter = meter_of(request)  # the whole file counts before it is transcribed
        await meter.add_ms(1000 * audio.size / batcher.engine.sample_rate)
        await meter.flush()
        transcript = await batcher.transcribe(AsrInput(audio, language or None))
        metrics.REQUEST_DURATION.labels("asr", "transcriptions").observe(
            time.perf_counter() - started
        )
        metrics.REQUESTS.labels("asr", "transcriptions", "ok").inc()
        return render(transcript, response_format, language)  # type: ignore[arg-type]

    return api
