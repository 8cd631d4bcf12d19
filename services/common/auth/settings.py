"""Authentication settings (`VA_AUTH__*`) and a tenant's abuse limits."""

from __future__ import annotations

from pydantic import BaseModel, Field, SecretStr, field_validator


class Limits(BaseModel):
    """Abuse limits of a tenant; on a key, unset fields take the deployment's defaults."""

    sessions: int | None = Field(default=None, ge=0, le=1_000_000)
    """Concurrent WebSocket sessions (gateway, ASR and TTS streams together)."""
    sessions_per_minute: int | None = Field(default=None, ge=0, le=1_000_000)
    """New WebSocket sessions per minute."""
    requests_per_minute: int | None = Field(default=None, ge=0, le=10_000_000)
    """REST requests per minute (transcriptions, speech, voices, tokens)."""
    audio_seconds_per_day: int | None = Field(default=None, ge=0, le=100_000_000)
    """Seconds of audio sent to be heard per UTC day (gateway, ASR stream, transcriptions)."""

    def over(self, defaults: Limits) -> Limits:
        """These limits, each unset one taken from `defaults`."""
        mine = self.model_dump(exclude_none=True)
        return defaults.model_copy(update=mine)


class DefaultLimits(Limits):
    """The deployment's limits for every tenant whose key sets none (docs/auth.md: why)."""

    sessions: int | None = Field(default=20, ge=0, le=1_000_000)
    """Concurrent WebSocket sessions per tenant (a host is designed for 30-100)."""
    sessions_per_minute: int | None = Field(default=60, ge=0, le=1_000_000)
    """New WebSocket sessions per tenant per minute (a reconnect loop is stopped)."""
    requests_per_minute: int | None = Field(default=600, ge=0, le=10_000_000)
    """REST requests per tenant per minute."""
    audio_seconds_per_day: int | None = Field(default=36_000, ge=0, le=100_000_000)
    """Seconds of audio heard per tenant per UTC day (10 h)."""


class AuthSettings(BaseModel):
    """Authentication, tenants and abuse limits (the same on every service)."""

    required: bool = True
    """Every entry point needs an API key or a client token but /health, /ready, /metrics
    (unless `protect_ops`) and the gateway's browser page and its static files. `false` is
    for development on loopback only: a service bound elsewhere refuses to start."""
    token_secret: SecretStr = SecretStr("")
    """HS256 secret of client tokens (≥ 32 characters), the same on every service; empty:
    one is generated once and kept in Redis (`<prefix>:auth:signing_secret`)."""
    token_ttl_s: int = Field(default=60, ge=10, le=7200)
    """Default lifetime of a client token: until then it opens (and resumes) sessions, as
    many as the tenant's limits allow; a session opened before it expires goes on."""
    allowed_origins: list[str] = []
    """Origins (`https://app.example.com`) whose pages may open WebSockets and call the REST
    API (CORS); same-origin pages and clients that send no Origin always may. `*`: any."""
    protect_ops: bool = False
    """`/metrics` and /health's details need a credential too (/health still says healthy)."""
    lease_renew_s: float = Field(default=20.0, ge=0.5, le=30.0)
    """How often an open WebSocket renews its session lease (which lasts 60 s) and checks
    that its key is still active: a revoked key's open connections end within this long."""
    limits: DefaultLimits = DefaultLimits()
    """Default limits of every tenant (a key may set its own)."""

    @field_validator("token_secret")
    @classmethod
    def _long_enough(cls, value: SecretStr) -> SecretStr:
        if 0 < len(value.get_secret_value()) < 32:
            raise ValueError("token_secret must be at least 32 characters (or empty)")
        return value
