"""The REST doors of the ASR service, compatible with OpenAI's audio API and its SDK.

`POST /v1/audio/transcriptions` and `POST /v1/audio/translations` (to English), and
`GET /v1/models` (`/v1/models/{id}`): the models this process serves (services/asr/
models.py). A plain `json`/`text` transcription of up to 30 s with no prompt takes the
batched path the streaming doors use (services/asr/engines/whisper.py); everything
else (segments, word timestamps, `srt`/`vtt`, a prompt or hotwords, a translation,
a longer file) is decoded whole with timestamps on the same model
(services/asr/engines/file.py), between the batches of the streaming doors.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Coroutine
from typing import Annotated, Any, Final, TypeVar

import numpy as np
from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.responses import Response

from services.asr.batcher import Batcher
from services.asr.engines.base import AsrInput, AudioF32, FileEngine, FileRequest, FileTranscript
from services.asr.engines.file import refuse_unknown_language
from services.asr.models import AsrModels
from services.asr.render import FORMATS, TIMED, from_utterance, render
from services.common import metrics
from services.common.audio.pcm import decode_file_rate
from services.common.auth.guard import meter_of
from services.common.errors import InvalidMessage, UnknownModel, UploadTooLarge

T = TypeVar("T")

BATCHED_MAX_S = 30.0
"""Longest upload the batched path takes (Whisper's window): longer ones are decoded whole."""
GRANULARITIES = frozenset({"word", "segment"})
CLIENT_CLOSED = 499
"""The status of a request whose client hung up before its answer (nginx's; never sent)."""


class ModelNotFound(UnknownModel):
    """`GET /v1/models/{id}` of a model not served: 404, as OpenAI answers."""

    code = "model_not_found"
    http_status = 404


def router(models: AsrModels, max_upload_bytes: int, max_file_s: float) -> APIRouter:
    """The REST routes of the ASR service."""
    api = APIRouter()

    @api.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [models.describe(n) for n in models.names()]}

    @api.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> dict[str, Any]:
        if model_id not in models.names():
            raise ModelNotFound(f"unknown model {model_id!r}; see GET /v1/models")
        return models.describe(model_id)

    async def transcribe(
        request: Request,
        file: UploadFile,
        model: str,
        fmt: str,
        asked: FileRequest,
        granularities: frozenset[str] = frozenset(),
    ) -> Response:
        started = time.perf_counter()
        if fmt not in FORMATS:
            raise InvalidMessage(
                f"response_format {fmt!r} is not supported; use {', '.join(FORMATS)}"
            )
        name = models.resolve(model)
        data = await file.read(max_upload_bytes + 1)
        if len(data) > max_upload_bytes:
            raise UploadTooLarge(f"the upload exceeds the limit of {max_upload_bytes} bytes")
        rate = models.default_batcher.engine.sample_rate
        audio, source_rate = await asyncio.to_thread(decode_file_rate, data, rate, max_file_s)
        meter = meter_of(request)  # the whole file counts before it is transcribed
        await meter.add_ms(1000 * audio.size / rate)
        await meter.flush()
        whole = dataclasses.replace(asked, audio=audio, source_rate=source_rate)
        door = "translations" if asked.task == "translate" else "transcriptions"
        async with models.use(name) as batcher:
            served, result = await _unless_gone(
                request, _run(batcher, whole, fmt, audio.size / rate)
            )
        if not served:  # the client hung up: its work stopped, nobody reads an answer
            metrics.REQUESTS.labels("asr", door, "cancelled").inc()
            return Response(status_code=CLIENT_CLOSED)
        metrics.REQUEST_DURATION.labels("asr", door).observe(time.perf_counter() - started)
        metrics.REQUESTS.labels("asr", door, "ok").inc()
        return render(result, fmt, asked.task, granularities)  # type: ignore[arg-type]

    @api.post("/v1/audio/transcriptions", response_model=None)
    async def transcriptions(
        request: Request,
        file: Annotated[UploadFile, File()],
        model: Annotated[str, Form(max_length=256)] = "whisper-1",
        language: Annotated[str | None, Form(max_length=16)] = None,
        prompt: Annotated[str | None, Form(max_length=4096)] = None,
        response_format: Annotated[str, Form()] = "json",
        temperature: Annotated[float, Form(ge=0.0, le=1.0)] = 0.0,
        timestamp_granularities: Annotated[
            list[str] | None, Form(alias="timestamp_granularities[]")
        ] = None,
        hotwords: Annotated[str | None, Form(max_length=1024)] = None,
    ) -> Response:
        asked = set(timestamp_granularities or ())
        if asked - GRANULARITIES:
            raise InvalidMessage(
                f"timestamp_granularities {sorted(asked - GRANULARITIES)} are not supported; "
                "use word and/or segment"
            )
        file_request = FileRequest(
            audio=_EMPTY,
            language=language or None,
            prompt=prompt or None,
            hotwords=hotwords or None,
            word_timestamps="word" in asked,
            temperature=temperature,
        )
        return await transcribe(
            request, file, model, response_format, file_request, frozenset(asked)
        )

    @api.post("/v1/audio/translations", response_model=None)
    async def translations(
        request: Request,
        file: Annotated[UploadFile, File()],
        model: Annotated[str, Form(max_length=256)] = "whisper-1",
        prompt: Annotated[str | None, Form(max_length=4096)] = None,
        response_format: Annotated[str, Form()] = "json",
        temperature: Annotated[float, Form(ge=0.0, le=1.0)] = 0.0,
    ) -> Response:
        file_request = FileRequest(
            audio=_EMPTY, task="translate", prompt=prompt or None, temperature=temperature
        )
        return await transcribe(request, file, model, response_format, file_request)

    return api


_EMPTY: Final[AudioF32] = np.zeros(0, dtype=np.float32)
"""The audio of a request before its upload is decoded."""


async def _run(
    batcher: Batcher, request: FileRequest, fmt: str, duration_s: float
) -> FileTranscript:
    """The batched path for what it can answer, else the whole-file path."""
    if isinstance(batcher.engine, FileEngine):
        refuse_unknown_language(batcher.engine, request)
    plain = (
        fmt not in TIMED
        and request.task == "transcribe"
        and not (request.prompt or request.hotwords or request.word_timestamps)
        and duration_s <= BATCHED_MAX_S
    )
    if plain:
        item = AsrInput(request.audio, request.language, request.source_rate)
        transcript = await batcher.transcribe(item)
        return from_utterance(transcript)
    engine = batcher.engine
    if not isinstance(engine, FileEngine):
        raise InvalidMessage(
            f"the {engine.name} engine gives no timestamps, prompts or translations: "
            "ask for json or text"
        )
    return await batcher.run_alone(engine.file_steps(request))


async def _unless_gone(request: Request, work: Coroutine[Any, Any, T]) -> tuple[bool, T | None]:
    """(True, `work`'s result), or (False, None) once the client hangs up first: `work` is
    cancelled then (the batcher drops an utterance still waiting, and stops a file at its
    next step). The server never cancels a handler whose client left: this watches."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_hung_up(request))
    try:
        done, _ = await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        gone.cancel()
    if task in done:
        return True, task.result()
    task.cancel()
    await asyncio.wait((task,))  # its batcher and model are let go before the answer
    return False, None


async def _hung_up(request: Request) -> None:
    """Return once the client has hung up. Its body is read by now: all the server has
    left to tell is `http.disconnect` (also when the response is complete)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
