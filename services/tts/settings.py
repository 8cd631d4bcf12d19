"""Settings of the TTS service."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from services.common.settings import BaseServiceSettings, ServerSettings


class EspeakSettings(BaseModel):
    """espeak-ng through the espeakng-loader wheel: the embedded engine."""

    default_voice: str = "en-us+klatt2"
    """Voice used when a request names none (chosen because ASR engines understand it)."""
    words_per_minute: int = Field(default=140, ge=80, le=450)
    """Speaking rate at speed 1.0."""


class ChatterboxSettings(BaseModel):
    """chatterbox-tts."""

    model: str = "chatterbox"
    """Model name (as `voice-agent models pull` names it) or a folder path."""
    models_dir: Path = Path("models")
    """Where pulled models live: `<models_dir>/<model>`."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Device; `auto` uses CUDA when torch sees a GPU."""
    device_index: int = Field(default=0, ge=0, le=63)
    """GPU index as this process sees it (after CUDA_VISIBLE_DEVICES)."""
    allow_download: bool = False
    """Download from the Hub at start-up if missing (off: fail with the fix)."""
    exaggeration: float = Field(default=0.5, ge=0.0, le=2.0)
    """Default emotion exaggeration."""
    cfg_weight: float = Field(default=0.5, ge=0.0, le=2.0)
    """Default classifier-free guidance weight."""
    temperature: float = Field(default=0.8, ge=0.05, le=2.0)
    """Default sampling temperature."""
    chunk_ms: int = Field(default=400, ge=40, le=5000)
    """Size of the audio chunks sent while streaming."""


class TtsSection(BaseModel):
    """The TTS service proper."""

    engine: str = "espeak"
    """Engine name: `espeak` or `chatterbox`."""
    espeak: EspeakSettings = EspeakSettings()
    """espeak-ng settings."""
    chatterbox: ChatterboxSettings = ChatterboxSettings()
    """chatterbox settings."""
    server: ServerSettings = ServerSettings(port=8002)
    """Where the service listens."""
    max_concurrent: int = Field(default=2, ge=1, le=256)
    """Syntheses running at once in this process."""
    max_queue: int = Field(default=256, ge=1, le=100_000)
    """Most requests waiting; more are refused with `capacity`."""
    max_input_chars: int = Field(default=4096, ge=1, le=100_000)
    """Longest text one request may carry."""
    chunk_ms: int = Field(default=200, ge=20, le=5000)
    """Size of the audio chunks sent on streams and over Redis."""


class TtsSettings(BaseServiceSettings):
    """All settings of the TTS service (env: `VA_TTS__...`, `VA_REDIS__...`)."""

    tts: TtsSection = TtsSection()
    """The TTS service."""
