"""`POST /v1/sessions`: an API key asks for a short-lived client token for a browser or a
phone; and `install_auth`, which puts the door (guard.py), CORS and this route on an app.

Its JSON body is refused past `MAX_BODY_BYTES` (413) before it is read whole (BodyLimit).
"""

from __future__ import annotations

from typing import Any, Final

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from pydantic import BaseModel, ConfigDict, Field
from redis.asyncio import Redis

from services.common.auth.api_keys import KeyStore
from services.common.auth.credentials import APP_SUBPROTOCOL, TOKEN_SUBPROTOCOL, sign_token
from services.common.auth.guard import AuthGuard, principal_of
from services.common.auth.settings import AuthSettings
from services.common.body_limit import BodyLimit
from services.common.errors import BodyTooLarge, Forbidden
from services.common.redact import install_redaction

MAX_BODY_BYTES: Final = 256 * 1024
"""The body's limit: instructions of 16 384 characters, each up to 12 bytes as JSON escapes
(a surrogate pair), and the rest."""


class TokenSession(BaseModel):
    """Settings the session opened with the token starts with (as `session.update`'s)."""

    model_config = ConfigDict(extra="forbid")
    voice: str | None = Field(default=None, min_length=1, max_length=128)
    agent: str | None = Field(default=None, min_length=1, max_length=64)
    language: str | None = Field(default=None, min_length=1, max_length=16)
    instructions: str | None = Field(default=None, min_length=1, max_length=16_384)


class TokenRequest(BaseModel):
    """The body of `POST /v1/sessions` (all optional)."""

    model_config = ConfigDict(extra="forbid")
    expires_in: int | None = Field(default=None, ge=10, le=7200)
    session: TokenSession | None = None


def install_auth(
    app: FastAPI,
    settings: AuthSettings,
    redis: Redis,
    prefix: str,
    service: str,
    accept_relay: bool = True,
) -> KeyStore:
    """Guard every route of `app`, answer CORS for the configured origins, and serve
    `POST /v1/sessions`. Returns the app's key store (it signs relay tokens: relay.py);
    `accept_relay` False refuses relay tokens (an edge)."""
    install_redaction()
    keys = KeyStore(redis, prefix, settings.token_secret.get_secret_value())
    app.add_middleware(
        AuthGuard,
        settings=settings,
        redis=redis,
        prefix=prefix,
        service=service,
        keys=keys,
        accept_relay=accept_relay,
    )
    if settings.allowed_origins:  # outermost: preflights are answered before the guard
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.allowed_origins,
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["authorization", "content-type"],
        )

    app.add_middleware(
        BodyLimit,
        limits={"/v1/sessions": MAX_BODY_BYTES},
        margin=0,
        what="the request body",
        error=BodyTooLarge,
    )

    @app.post("/v1/sessions")
    async def new_session(request: Request, body: TokenRequest | None = None) -> dict[str, Any]:
        principal = principal_of(request)
        if principal.kind in ("token", "relay"):
            raise Forbidden("a client token cannot ask for another: use an API key")
        body = body or TokenRequest()
        ttl = body.expires_in or settings.token_ttl_s
        session = body.session.model_dump(exclude_none=True) if body.session else {}
        token, expires_at = sign_token(
            await keys.signing_secret(),
            principal.tenant,
            principal.key_id or "none",
            ttl,
            session,
        )
        return {
            "token": token,
            "expires_at": expires_at,
            "tenant": principal.tenant,
            "subprotocols": [APP_SUBPROTOCOL, f"{TOKEN_SUBPROTOCOL}<token>"],
        }

    return keys
