"""`POST /v1/sessions`: an API key asks for a short-lived client token for a browser or a
phone; and `install_auth`, which puts the door (guard.py), CORS and this route on an app.

The route reads its JSON body itself, at most `MAX_BODY_BYTES` of it (413 past that, from
its `Content-Length` at once or as soon as the bytes read pass it): a framework-parsed body
is read whole, whatever its size, before any field is checked.
"""

from __future__ import annotations

from typing import Any, Final

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from redis.asyncio import Redis

from services.common.auth.api_keys import KeyStore
from services.common.auth.credentials import APP_SUBPROTOCOL, TOKEN_SUBPROTOCOL, sign_token
from services.common.auth.guard import AuthGuard, principal_of
from services.common.auth.settings import AuthSettings
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


async def read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The request's body; BodyTooLarge once it is over `limit` bytes (nothing more read)."""
    refused = BodyTooLarge(f"the request body exceeds the limit of {limit} bytes")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise refused
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise refused
    return bytes(body)


async def token_request(request: Request) -> TokenRequest:
    """The parsed body (empty: all defaults); a malformed one as FastAPI reports one."""
    raw = await read_body(request)
    if raw.strip() in (b"", b"null"):
        return TokenRequest()
    try:
        return TokenRequest.model_validate_json(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in errors]) from None


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

    schema = {"content": {"application/json": {"schema": TokenRequest.model_json_schema()}}}

    @app.post("/v1/sessions", openapi_extra={"requestBody": schema})
    async def new_session(request: Request) -> dict[str, Any]:
        principal = principal_of(request)
        if principal.kind in ("token", "relay"):
            raise Forbidden("a client token cannot ask for another: use an API key")
        body = await token_request(request)
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
