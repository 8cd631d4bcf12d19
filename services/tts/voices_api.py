"""`POST /v1/voices`, `GET /v1/voices`, `DELETE /v1/voices/{id}`: the voice library.

An uploaded clip becomes a voice id usable wherever a voice is named
(`/v1/audio/speech`, `/v1/stream/tts`, gateway sessions). Bad uploads are 400s with
code `invalid_audio` and a message saying what is wrong; an unknown id is a 404.
"""

from __future__ import annotations

import asyncio
import re
from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.responses import JSONResponse

from services.common.auth.guard import principal_of
from services.common.errors import InvalidMessage, UnknownVoice
from services.tts.synthesizer import OPENAI_VOICES, Synthesizer
from services.tts.voices import VoiceLibrary, decode_clip

_ESPEAK_VOICE = re.compile(r"^[a-z]{2,3}(-[a-z0-9]{1,8})*(\+[A-Za-z0-9_-]{1,32})?$")
_PIPER_VOICE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class VoiceNotFound(UnknownVoice):
    """DELETE of a voice id the library does not hold."""

    http_status = 404


def _name(name: str) -> str:
    cleaned = " ".join(name.split())
    if not 1 <= len(cleaned) <= 64:
        raise InvalidMessage("name must be 1 to 64 characters")
    return cleaned


def _stand_in(field: str, voice: str | None, pattern: re.Pattern[str], like: str) -> str | None:
    """A stand-in voice name for engines that cannot clone (None when not given)."""
    if voice is None or voice == "":
        return None
    if not pattern.match(voice):
        raise InvalidMessage(f"{field} {voice!r} is not a voice name like {like}")
    return voice


def router(synthesizer: Synthesizer, library: VoiceLibrary) -> APIRouter:
    """The voice-library routes of the TTS service."""
    api = APIRouter()
    engine = synthesizer.engine

    @api.post("/v1/voices", status_code=201)
    async def upload(
        request: Request,
        file: Annotated[UploadFile, File()],
        name: Annotated[str, Form()],
        espeak_voice: Annotated[str | None, Form()] = None,
        piper_voice: Annotated[str | None, Form()] = None,
    ) -> dict[str, Any]:
        label = _name(name)
        espeak = _stand_in("espeak_voice", espeak_voice, _ESPEAK_VOICE, "en-us+klatt2")
        piper = _stand_in("piper_voice", piper_voice, _PIPER_VOICE, "joe")
        data = await file.read(library.settings.max_upload_bytes + 1)  # over: decode_clip says so
        samples, stats = await asyncio.to_thread(decode_clip, data, library.settings)
        tenant = principal_of(request).tenant
        info = await library.add(samples, stats, label, espeak, piper, tenant)
        try:  # the engine may refuse it (an unknown stand-in) or fail to prepare it
            clip = await library.local_clip(info)
            voice = engine.library_voice(info.speaker(clip))
            await asyncio.to_thread(engine.prepare_voice, voice)
        except BaseException:
            await library.delete(info.id, tenant)
            engine.forget_voice(info.id)
            raise
        return {**info.public(), "engine": engine.name}

    @api.get("/v1/voices")
    async def voices(request: Request) -> dict[str, Any]:
        builtin = [{"id": v, "engine": engine.name, "source": "engine"} for v in engine.voices()]
        stored = [
            {**info.public(), "engine": engine.name, "source": "library"}
            for info in await library.list(principal_of(request).tenant)
        ]
        return {
            "default": engine.default_voice,
            "voices": builtin + stored,
            "openai_voices": {"names": sorted(OPENAI_VOICES), "maps_to": engine.default_voice},
        }

    @api.delete("/v1/voices/{voice_id}")
    async def delete(voice_id: str, request: Request) -> JSONResponse:
        if not await library.delete(voice_id, principal_of(request).tenant):
            raise VoiceNotFound(f"no voice {voice_id!r} in the library; see GET /v1/voices")
        engine.forget_voice(voice_id)
        return JSONResponse({"id": voice_id, "deleted": True})

    return api
