"""Who is calling: API keys, short-lived client tokens, and the credential of a request.

An API key (`va_<id>_<secret>`) is for servers; Redis keeps only the SHA-256 of its secret
(api_keys.py). A client token is a JWT (HS256) that `POST /v1/sessions` signs for a key: it
names the tenant and the key, expires (60 s by default, 2 h at most) and may carry session
settings. Both travel as `Authorization: Bearer ...`; a browser, which cannot set headers
on a WebSocket, offers the token as the subprotocol `voice-agent.token.<token>` next to
`voice-agent.v1` (or, for clients that can do neither, `?access_token=`). An API key is
refused in the query string: a URL ends up in logs (the services redact theirs, a proxy's
error log may not), and a key, unlike a token, is good until revoked.

A relay token is a client token with a `relay` claim, signed by a service for the service
behind it (the gateway for the duplex service): it names the caller's tenant and key, and
says the caller's session and audio are counted already by the service that relays them.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal
from urllib.parse import parse_qsl

import jwt

from services.common.auth.settings import AuthSettings, Limits
from services.common.errors import Unauthorized
from services.common.tenancy import DEFAULT_TENANT

APP_SUBPROTOCOL: Final = "voice-agent.v1"
TOKEN_SUBPROTOCOL: Final = "voice-agent.token."  # noqa: S105 (a prefix, no secret)
TOKEN_SUBPROTOCOLS: Final = (TOKEN_SUBPROTOCOL, "openai-insecure-api-key.")
"""Ours, and OpenAI's browser convention for /v1/realtime."""
TOKEN_QUERY: Final = "access_token"  # noqa: S105 (a parameter name)
KEY_PREFIX: Final = "va_"
_KEY: Final = re.compile(r"^va_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")
_ISSUER: Final = "voice-agent"
MAX_CREDENTIAL_CHARS: Final = 8192


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request is from, once its credential is checked."""

    tenant: str
    kind: Literal["key", "token", "relay", "anonymous"]
    """`relay`: a relay token (a service in front admitted the caller and counts it)."""
    key_id: str | None = None
    limits: Limits | None = None
    """None: no limits (authentication off)."""
    session: Mapping[str, Any] = field(default_factory=dict)
    """Session settings a client token carries."""


ANONYMOUS: Final = Principal(tenant=DEFAULT_TENANT, kind="anonymous")


def new_key() -> tuple[str, str, str]:
    """(key id, plain key shown once, SHA-256 of its secret kept in Redis)."""
    key_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    return key_id, f"va_{key_id}_{secret}", secret_hash(secret)


def secret_hash(secret: str) -> str:
    """Keys are 256 random bits: a fast hash is safe (slow hashes are for passwords)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def split_key(plain: str) -> tuple[str, str] | None:
    """(key id, secret) of something shaped like an API key, else None."""
    match = _KEY.match(plain)
    return (match.group(1), match.group(2)) if match else None


def hash_matches(secret: str, stored: str) -> bool:
    return hmac.compare_digest(secret_hash(secret), stored)


def sign_token(
    secret: bytes,
    tenant: str,
    key_id: str,
    ttl_s: int,
    session: Mapping[str, Any],
    relay: bool = False,
) -> tuple[str, int]:
    """A client token and its expiry (Unix seconds); `relay`: a relay token."""
    now = int(time.time())
    claims: dict[str, Any] = {
        "iss": _ISSUER,
        "aud": _ISSUER,
        "sub": tenant,
        "kid": key_id,
        "iat": now,
        "exp": now + ttl_s,
        "jti": secrets.token_hex(8),
    }
    if session:
        claims["session"] = dict(session)
    if relay:
        claims["relay"] = True
    return jwt.encode(claims, secret, algorithm="HS256"), now + ttl_s


def verify_token(secret: bytes, token: str) -> dict[str, Any]:
    """The claims of a valid, unexpired token; Unauthorized otherwise (never echoing it)."""
    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            secret,
            algorithms=["HS256"],
            audience=_ISSUER,
            issuer=_ISSUER,
            options={"require": ["exp", "iat", "sub", "kid"]},
        )
    except jwt.ExpiredSignatureError:
        raise Unauthorized(
            "the client token expired: ask for a new one (POST /v1/sessions)"
        ) from None
    except jwt.PyJWTError:
        raise Unauthorized("invalid client token") from None
    if not (isinstance(claims["sub"], str) and isinstance(claims["kid"], str)):
        raise Unauthorized("invalid client token")
    if not isinstance(claims.get("session", {}), dict):
        raise Unauthorized("invalid client token")
    if not isinstance(claims.get("relay", False), bool):
        raise Unauthorized("invalid client token")
    return claims


def _headers(scope: Mapping[str, Any], name: bytes) -> list[str]:
    return [v.decode("latin-1") for k, v in scope.get("headers", ()) if k.lower() == name]


def credential(scope: Mapping[str, Any]) -> str | None:
    """The key or token a request carries: `Authorization: Bearer`, then (WebSocket only)
    the `voice-agent.token.` subprotocol, then `?access_token=`. Unauthorized when one is
    there but malformed; None when there is none."""
    found: str | None = None
    authorization = _headers(scope, b"authorization")
    if authorization:
        scheme, _, value = authorization[0].strip().partition(" ")
        if len(authorization) > 1 or scheme.lower() != "bearer" or not value.strip():
            raise Unauthorized("send the credential as `Authorization: Bearer <key or token>`")
        found = value.strip()
    elif scope.get("type") == "websocket":
        found = _subprotocol_token(scope) or _query_token(scope)
    if found is not None and (not 0 < len(found) <= MAX_CREDENTIAL_CHARS or not found.isascii()):
        raise Unauthorized("malformed credential")
    return found


def _subprotocol_token(scope: Mapping[str, Any]) -> str | None:
    for offered in scope.get("subprotocols") or ():
        for prefix in TOKEN_SUBPROTOCOLS:
            if isinstance(offered, str) and offered.startswith(prefix):
                return offered[len(prefix) :]
    return None


def _query_token(scope: Mapping[str, Any]) -> str | None:
    query = bytes(scope.get("query_string") or b"").decode("latin-1")
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name == TOKEN_QUERY:
            if value.startswith(KEY_PREFIX):
                raise Unauthorized(
                    "an API key may not travel in the URL (URLs end up in logs): send it as "
                    "`Authorization: Bearer`; ?access_token= takes a client token only"
                )
            return value
    return None


def app_subprotocol(offered: list[str] | None) -> str | None:
    """The subprotocol to accept a WebSocket with: ours when offered (a browser that sent
    its token as a subprotocol must get one back), never the token itself."""
    return APP_SUBPROTOCOL if offered and APP_SUBPROTOCOL in offered else None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_problem(settings: AuthSettings, host: str) -> str | None:
    """Why a service must not start on `host` (None when it may): authentication off is
    for loopback only, so an open service is never reachable from another host by mistake."""
    if settings.required or is_loopback(host):
        return None
    return (
        f"refusing to serve on {host} with authentication off (VA_AUTH__REQUIRED=false): "
        "anyone who reaches the port could use the models. Turn it on (create a key with "
        "`voice-agent keys create --tenant NAME`) or bind 127.0.0.1"
    )
