"""The voice library: uploaded reference clips, validated, kept on disk, described in Redis.

A clip is accepted when it decodes (anything PyAV reads), lasts `min_duration_s` to
`max_duration_s`, is loud enough (RMS level above `min_rms_dbfs`) and not clipped
(at most `max_clipped_fraction` of its samples at full scale). It is stored as
mono PCM16 WAV at `sample_rate` in `<dir>/<id>.wav`; its metadata is one Redis hash
per voice (`<prefix>:voice:<id>`) plus a set of ids (`<prefix>:voices`). A copy of
the clip also goes to Redis (`<prefix>:voice:<id>:clip`, at most ~1.5 MB), so a TTS
worker on another host writes it to its own `dir` the first time it speaks with it.

Ids are `v_` and 16 hex digits, never reused, and cannot collide with engine voices.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import secrets
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
from redis.asyncio import Redis

from services.common.audio.pcm import AudioF32, decode_file, encode_audio
from services.common.bus.keys import Keys
from services.common.errors import (
    EngineUnavailable,
    InvalidAudio,
    InvalidMessage,
    UploadTooLarge,
)
from services.common.tenancy import DEFAULT_TENANT
from services.tts.engines.base import LibraryVoice
from services.tts.settings import VoiceLibrarySettings

VOICE_ID: Final = re.compile(r"^v_[0-9a-f]{16}$")
FULL_SCALE: Final = 0.99
"""A sample at or above this magnitude counts as clipped."""
SILENCE_DBFS: Final = -120.0


class VoiceStorageUnavailable(EngineUnavailable):
    """The clips' folder (`VA_TTS__VOICES__DIR`) cannot be written (HTTP 503)."""


def is_library_id(voice: str | None) -> bool:
    """Whether a requested voice names a library voice (by its id)."""
    return voice is not None and VOICE_ID.match(voice) is not None


@dataclass(frozen=True, slots=True)
class ClipStats:
    """What validation measures on a decoded clip."""

    duration_s: float
    rms_dbfs: float
    peak: float
    clipped_fraction: float


def analyze(samples: AudioF32, rate: int) -> ClipStats:
    """Duration, RMS level (dBFS, a full-scale sine is -3), peak and clipped share."""
    if samples.size == 0:
        return ClipStats(0.0, SILENCE_DBFS, 0.0, 0.0)
    magnitude = np.abs(samples.astype(np.float64))
    rms = math.sqrt(float(np.mean(magnitude**2)))
    return ClipStats(
        duration_s=samples.size / rate,
        rms_dbfs=20 * math.log10(rms) if rms > 0 else SILENCE_DBFS,
        peak=float(magnitude.max()),
        clipped_fraction=float(np.mean(magnitude >= FULL_SCALE)),
    )


def check_clip(stats: ClipStats, settings: VoiceLibrarySettings) -> None:
    """Raise InvalidAudio naming what is wrong with a clip (and what would be accepted)."""
    if not settings.min_duration_s <= stats.duration_s <= settings.max_duration_s:
        length = "short" if stats.duration_s < settings.min_duration_s else "long"
        raise InvalidAudio(
            f"the clip is too {length} ({stats.duration_s:.1f} s): a voice needs "
            f"{settings.min_duration_s:g} to {settings.max_duration_s:g} s of speech"
        )
    if stats.rms_dbfs < settings.min_rms_dbfs:
        raise InvalidAudio(
            f"the clip is silent or too quiet ({stats.rms_dbfs:.1f} dBFS RMS, at least "
            f"{settings.min_rms_dbfs:g} needed)"
        )
    if stats.clipped_fraction > settings.max_clipped_fraction:
        raise InvalidAudio(
            f"the clip is clipped ({100 * stats.clipped_fraction:.1f}% of samples at full "
            f"scale, at most {100 * settings.max_clipped_fraction:g}%): record it less loud"
        )


def decode_clip(data: bytes, settings: VoiceLibrarySettings) -> tuple[AudioF32, ClipStats]:
    """Decode and validate an upload; blocking (PyAV): call it off the event loop."""
    if len(data) > settings.max_upload_bytes:
        raise UploadTooLarge(f"the upload exceeds {settings.max_upload_bytes} bytes")
    # twice the longest clip: a longer one gets check_clip's message, and a small file of a
    # low bitrate that holds hours stops decoding early
    samples = decode_file(data, settings.sample_rate, max_seconds=2 * settings.max_duration_s)
    stats = analyze(samples, settings.sample_rate)
    check_clip(stats, settings)
    return samples, stats


@dataclass(frozen=True, slots=True)
class VoiceInfo:
    """One library voice, as stored in its Redis hash."""

    id: str
    name: str
    duration_s: float
    sample_rate: int
    rms_dbfs: float
    peak: float
    created_at: float
    espeak_voice: str | None = None
    piper_voice: str | None = None
    tenant: str = DEFAULT_TENANT
    """Whose voice it is: only this tenant lists, uses or deletes it."""

    def speaker(self, clip: Path) -> LibraryVoice:
        """What an engine needs to speak with this voice (its clip on this host)."""
        return LibraryVoice(self.id, clip, self.espeak_voice, self.piper_voice)

    def to_redis(self) -> dict[str, str]:
        return {k: str(v) for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_redis(cls, fields: Mapping[bytes | str, bytes | str]) -> VoiceInfo:
        raw = {_text(k): _text(v) for k, v in fields.items()}
        return cls(
            id=raw["id"],
            name=raw["name"],
            duration_s=float(raw["duration_s"]),
            sample_rate=int(raw["sample_rate"]),
            rms_dbfs=float(raw["rms_dbfs"]),
            peak=float(raw["peak"]),
            created_at=float(raw["created_at"]),
            espeak_voice=raw.get("espeak_voice"),
            piper_voice=raw.get("piper_voice"),
            tenant=raw.get("tenant", DEFAULT_TENANT),
        )

    def public(self) -> dict[str, Any]:
        """The JSON the API returns."""
        body = asdict(self)
        del body["tenant"]
        body["duration_s"] = round(self.duration_s, 3)
        body["rms_dbfs"] = round(self.rms_dbfs, 1)
        body["peak"] = round(self.peak, 3)
        return body


class VoiceLibrary:
    """Library voices in Redis (metadata, a copy of the clip) and on this host's disk."""

    def __init__(self, redis: Redis, prefix: str, settings: VoiceLibrarySettings) -> None:
        self.redis = redis
        self.prefix = prefix
        self.keys = Keys(prefix)
        self.settings = settings

    def _key(self, voice_id: str, part: str = "") -> str:
        return self.keys.voice(voice_id, part)

    def _index(self, tenant: str) -> str:
        return self.keys.voices(tenant)

    def clip_path(self, voice_id: str) -> Path:
        return self.settings.dir / f"{voice_id}.wav"

    async def add(
        self,
        samples: AudioF32,
        stats: ClipStats,
        name: str,
        espeak_voice: str | None = None,
        piper_voice: str | None = None,
        tenant: str = DEFAULT_TENANT,
    ) -> VoiceInfo:
        """Store a validated clip; InvalidMessage when the tenant's library is full."""
        if await self.redis.scard(self._index(tenant)) >= self.settings.max_voices:
            raise InvalidMessage(
                f"the voice library is full ({self.settings.max_voices} voices): delete one first"
            )
        info = VoiceInfo(
            id=f"v_{secrets.token_hex(8)}",
            name=name,
            duration_s=stats.duration_s,
            sample_rate=self.settings.sample_rate,
            rms_dbfs=stats.rms_dbfs,
            peak=stats.peak,
            created_at=time.time(),
            espeak_voice=espeak_voice,
            piper_voice=piper_voice,
            tenant=tenant,
        )
        wav = await asyncio.to_thread(encode_audio, samples, info.sample_rate, "wav")
        await self._store(self.clip_path(info.id), wav)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(self._key(info.id, ":clip"), wav)
            pipe.hset(self._key(info.id), mapping=info.to_redis())  # type: ignore[arg-type]
            pipe.sadd(self._index(tenant), info.id)
            await pipe.execute()
        return info

    async def get(self, voice_id: str, tenant: str | None = None) -> VoiceInfo | None:
        """The voice's metadata; None when it is not (or no longer) in the library, or is
        not `tenant`'s (None: anyone's)."""
        if not is_library_id(voice_id):
            return None
        fields = await self.redis.hgetall(self._key(voice_id))
        info = VoiceInfo.from_redis(fields) if fields else None
        if info is not None and tenant is not None and info.tenant != tenant:
            return None
        return info

    async def list(self, tenant: str = DEFAULT_TENANT) -> list[VoiceInfo]:
        """The tenant's library voices, oldest first."""
        ids = sorted(_text(v) for v in await self.redis.smembers(self._index(tenant)))
        found = await asyncio.gather(*(self.get(voice_id, tenant) for voice_id in ids))
        return sorted((v for v in found if v is not None), key=lambda v: v.created_at)

    async def delete(self, voice_id: str, tenant: str = DEFAULT_TENANT) -> bool:
        """Remove one of the tenant's voices everywhere it is stored; False when it has
        no such voice."""
        if await self.get(voice_id, tenant) is None:
            return False
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.srem(self._index(tenant), voice_id)
            pipe.delete(self._key(voice_id), self._key(voice_id, ":clip"))
            await pipe.execute()
        await asyncio.to_thread(self.clip_path(voice_id).unlink, missing_ok=True)
        return True

    async def local_clip(self, info: VoiceInfo) -> Path:
        """The clip on this host's disk, fetched from Redis the first time it is needed."""
        path = self.clip_path(info.id)
        if path.is_file():
            return path
        wav = await self.redis.get(self._key(info.id, ":clip"))
        if not isinstance(wav, bytes):
            raise InvalidAudio(f"the clip of voice {info.id!r} is missing: upload it again")
        await self._store(path, wav)
        return path

    async def _store(self, path: Path, wav: bytes) -> None:
        """Write a clip to this host's disk; VoiceStorageUnavailable (503, naming the
        setting) when the folder is not writable, as a read-only install is."""
        try:
            await asyncio.to_thread(_write_atomically, path, wav)
        except OSError as exc:
            raise VoiceStorageUnavailable(
                f"the voice library cannot write to {self.settings.dir} "
                f"({exc.strerror or type(exc).__name__}): set VA_TTS__VOICES__DIR to a "
                "writable folder"
            ) from exc


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".upload-", suffix=".wav")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
