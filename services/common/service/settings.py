"""Settings shared by every service: Redis, HTTP serving, and the base settings class.

Every service has one validated settings object (a subclass of `BaseServiceSettings`)
read from the environment with the prefix `VA_` and `__` between nested sections,
e.g. `VA_REDIS__URL=redis://host:6379/0` or `VA_ASR__ENGINE=faster-whisper`.
Tests construct settings directly; nothing reads the environment at import time.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.common.auth.settings import AuthSettings
from services.common.bus.settings import RedisSettings

Profile = Literal["lite", "dual-gpu", "fake", "duplex"]


class ServerSettings(BaseModel):
    """Where a service listens."""

    host: str = "127.0.0.1"
    """Bind address."""
    port: int = Field(default=8000, ge=1, le=65535)
    """TCP port."""
    ws_max_frame_bytes: int = Field(default=1 << 20, ge=1024, le=16 << 20)
    """Hard cap on one WebSocket frame (close 1009 above it)."""
    drain_timeout_s: float = Field(default=20.0, ge=0, le=600)
    """On shutdown, how long open sessions get to finish."""


class EngineSection(BaseModel):
    """A service's own section: it names the engine the service runs."""

    engine: str
    """Engine name."""


class BaseServiceSettings(BaseSettings):
    """Base of every service's settings: env prefix `VA_`, nested sections with `__`."""

    model_config = SettingsConfigDict(
        env_prefix="VA_", env_nested_delimiter="__", extra="ignore", env_file=None
    )

    profile: Profile = "lite"
    """`lite` (embedded CPU engines), `dual-gpu` (faster-whisper GPU 0, chatterbox GPU 1),
    `fake` (instant fake ASR and TTS, to measure what the gateway and Redis add) or `duplex`
    (the full-duplex service's Moshi on GPU 0; docs/duplex.md)."""
    redis: RedisSettings = RedisSettings()
    """The Redis bus."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Log level."""
    blas_threads: int = Field(default=1, ge=0, le=256)
    """Threads of numpy's BLAS (OpenBLAS) in each service's process (0: leave the library's
    own choice, one per core unless the environment says otherwise). One: the engines run
    their own thread pools, and BLAS threads left spinning after numpy's small products burn
    a core beside them (a spoken turn cost 0.90 CPU-s with one, 1.03 with two on 2 cores;
    benchmarks/cpu_per_turn.py)."""
    auth: AuthSettings = AuthSettings()
    """Authentication, tenants and abuse limits (docs/auth.md)."""


def settings_problem(exc: ValidationError) -> str:
    """A settings error as the variables a user set: one line per wrong value, naming its
    `VA_...` variable, what it was given and what it takes (pydantic names the field path)."""
    lines = []
    for error in exc.errors():
        name = "VA_" + "__".join(str(part) for part in error["loc"]).upper()
        given = error.get("input")
        shown = f"={given}" if isinstance(given, str | int | float) else ""
        lines.append(f"{name}{shown}: {error['msg'].removeprefix('Value error, ')}")
    return "; ".join(lines)
