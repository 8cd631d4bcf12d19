"""The door of every service: an ASGI middleware that checks the Origin (and Host), the
credential and the tenant's limits of each HTTP request and WebSocket handshake before the
app sees it.

A refused WebSocket never gets past its handshake: the middleware answers the upgrade with
an HTTP error (401, 403 or 429, JSON body, Retry-After) instead of accepting it, so no
session exists and no job is queued. Only /health and /ready (and /metrics unless
`protect_ops`) are open. Authentication off (`required: false`) skips the credential and
the limits but never the browser checks (browser.py: Origin, Host, local callers).

A client token may do what its key may but mint tokens and change the voice library
(POST/DELETE /v1/voices: 403). An open WebSocket's key is checked again at each renewal of
its session lease (`lease_renew_s`); once revoked, the connection is ended (cutoff.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Final

from fastapi.responses import JSONResponse
from redis.asyncio import Redis
from starlette.requests import HTTPConnection
from starlette.websockets import WebSocket

from services.common import metrics
from services.common.auth.api_keys import KeyStore
from services.common.auth.browser import (
    changes_state,
    host_allowed,
    local_caller,
    origin_allowed,
)
from services.common.auth.credentials import ANONYMOUS, Principal, credential
from services.common.auth.cutoff import NATIVE_PATHS, Cutoff
from services.common.auth.limits import NO_METER, AudioMeter, Limiter
from services.common.auth.settings import AuthSettings
from services.common.bus.connection import REDIS_DOWN, REDIS_FAILED
from services.common.errors import Forbidden, Unauthorized, VoiceAgentError

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS: Final = frozenset({"/health", "/ready"})
LOCAL_PATHS: Final = frozenset({"/admin/drain"})
"""Open to callers on this host only (the Kubernetes preStop hook), refused to all others
whether authentication is on or off (browser.local_caller); the route checks too."""
PAGE_PATHS: Final = frozenset({"/", "/favicon.ico"})
PAGE_PREFIX: Final = "/static/"
"""The gateway's browser page (static files): it asks for its token, so it loads without."""
KEY_ONLY_PREFIX: Final = "/v1/voices"
"""Changing the voice library (POST /v1/voices, DELETE /v1/voices/<id>) needs an API key: a
client token, which a browser holds, may use the tenant's voices but not add or delete."""
CUTOFF: Final = "va.cutoff"
PRINCIPAL: Final = "va.principal"
METER: Final = "va.meter"
BRIEF_HEALTH: Final = "va.brief_health"
AUDIO_ROUTES: Final = frozenset({"/v1/audio/transcriptions", "/v1/audio/translations"})
LATE_PATHS: Final = frozenset({"/v1/twilio"})
"""WebSocket routes whose callers cannot send a credential with the upgrade (Twilio sends
no headers; it names the credential in the stream's first message): with none in the
upgrade, the guard lets it through and the route calls the admission it leaves in the scope
(`late_admission`) with the credential it read, before any session starts."""
LATE: Final = "va.late_admission"
LateAdmission = Callable[[str | None], AbstractAsyncContextManager[None]]
"""Check a credential read after the upgrade, count the session (its lease held for the
block) and meter its audio: what the guard does at the door, later."""


class StoreUnreachable(VoiceAgentError):
    """Redis, which holds the keys and the limits, does not answer (HTTP 503)."""

    http_status = 503


def principal_of(conn: HTTPConnection) -> Principal:
    """Who the request is from (anonymous when authentication is off)."""
    found = conn.scope.get(PRINCIPAL)
    return found if isinstance(found, Principal) else ANONYMOUS


def meter_of(conn: HTTPConnection) -> AudioMeter:
    """The connection's audio meter (counts nothing when authentication is off)."""
    found = conn.scope.get(METER)
    return found if isinstance(found, AudioMeter) else NO_METER


def late_admission(conn: HTTPConnection) -> LateAdmission | None:
    """The admission a late-credential route must pass (None: authentication is off, or the
    upgrade carried a credential the guard checked already)."""
    found = conn.scope.get(LATE)
    return found if callable(found) else None


def retry_headers(exc: VoiceAgentError) -> dict[str, str] | None:
    wait = exc.retry_after_s
    return None if wait is None else {"Retry-After": str(max(1, round(wait)))}


def error_response(exc: VoiceAgentError) -> JSONResponse:
    return JSONResponse(exc.body(), exc.http_status, headers=retry_headers(exc))


async def refuse_handshake(ws: WebSocket, exc: VoiceAgentError, service: str) -> None:
    """Answer a WebSocket upgrade with the error's HTTP status instead of accepting it,
    counted as the door counts its own refusals."""
    metrics.AUTH_REFUSED.labels(service, exc.code).inc()
    metrics.ERRORS.labels(service, exc.code).inc()
    await ws.send_denial_response(error_response(exc))


def changes_library(scope: Scope) -> bool:
    """A request that adds or deletes a voice of the tenant's library."""
    path = str(scope.get("path", ""))
    library = path == KEY_ONLY_PREFIX or path.startswith(KEY_ONLY_PREFIX + "/")
    return scope["type"] == "http" and library and changes_state(scope)


class AuthGuard:
    """The middleware; one per app, sharing the app's Redis client."""

    def __init__(
        self,
        app: ASGIApp,
        settings: AuthSettings,
        redis: Redis,
        prefix: str,
        service: str,
        keys: KeyStore | None = None,
        accept_relay: bool = True,
    ) -> None:
        self.app = app
        self.settings = settings
        self.service = service
        self.accept_relay = accept_relay
        """Whether relay tokens are taken here (not on an edge such as the gateway: one that
        leaked from the network behind it must not skip the edge's limits)."""
        self.keys = keys or KeyStore(redis, prefix, settings.token_secret.get_secret_value())
        """The app's one key store (`install_auth` passes the one its token route uses)."""
        self.limiter = Limiter(redis, prefix)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        try:
            self._check_browser(scope)
            counted = await self._admit(scope)
        except VoiceAgentError as exc:
            await self._refuse(scope, receive, send, exc)
            return
        if scope["type"] == "websocket" and self.settings.required:
            cutoff = Cutoff(receive, send, scope.get("path", "") in NATIVE_PATHS)
            scope[CUTOFF] = cutoff  # a revoked key ends the connection through it
            receive, send = cutoff.receive, cutoff.send
        if scope["type"] == "websocket" and counted:
            await self._serve_session(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    def _check_browser(self, scope: Scope) -> None:
        """Forbidden for what a web page must not make this service do (browser.py)."""
        path, allowed = scope.get("path", ""), self.settings.allowed_origins
        if path in LOCAL_PATHS and not local_caller(scope):
            raise Forbidden(
                f"{path} is for callers on this host only, sending no Origin and no "
                "forwarding header (X-Forwarded-For, Forwarded, X-Real-IP)"
            )
        if not self.settings.required and not host_allowed(scope, allowed):
            raise Forbidden(
                "with authentication off only a Host of localhost or an IP address is "
                "served (a DNS name could be a rebinding page's); list the name's origin "
                "in VA_AUTH__ALLOWED_ORIGINS to serve it"
            )
        if changes_state(scope) and not origin_allowed(scope, allowed):
            what = "open a WebSocket" if scope["type"] == "websocket" else "send this request"
            raise Forbidden(f"this Origin may not {what} here")

    def _open(self, path: str, scope: Scope) -> bool:
        if path in LOCAL_PATHS:
            return local_caller(scope)
        if path in PAGE_PATHS or path.startswith(PAGE_PREFIX):
            return bool(scope["type"] == "http")  # the browser page: static files, no data
        return path in OPEN_PATHS or (path == "/metrics" and not self.settings.protect_ops)

    async def _admit(self, scope: Scope) -> bool:
        """Check the credential and the per-request limits; True when the request is a
        tenant's (and must be counted), False when it passes as it is."""
        path = scope.get("path", "")
        if not self.settings.required:
            return False
        if self._open(path, scope):
            if path == "/health" and self.settings.protect_ops:
                scope[BRIEF_HEALTH] = not await self._known(scope)
            return False
        if scope["type"] == "websocket" and path in LATE_PATHS and credential(scope) is None:
            scope[LATE] = lambda found: self._late(scope, found)
            return False
        principal = await self._principal(scope)
        return await self._count(scope, principal)

    async def _count(self, scope: Scope, principal: Principal) -> bool:
        """Check the tenant's per-request limits and give the request its meter."""
        path = scope.get("path", "")
        scope[PRINCIPAL] = principal
        if principal.kind != "key" and changes_library(scope):
            raise Forbidden(
                "changing the voice library (POST /v1/voices, DELETE /v1/voices/<id>) needs "
                "an API key: a client token may use the tenant's voices, not add or delete them"
            )
        if principal.kind == "relay":
            if not self.accept_relay:
                raise Unauthorized("a relay token is for the services behind a gateway")
            return False  # the service that relayed the caller counts its session and audio
        limits = principal.limits
        assert limits is not None
        scope[METER] = AudioMeter(self.limiter, principal.tenant, limits.audio_seconds_per_day)
        tenant = principal.tenant
        try:
            if scope["type"] == "websocket":
                await self.limiter.hit(tenant, "sessions", limits.sessions_per_minute)
                await self.limiter.check_audio(tenant, limits.audio_seconds_per_day)
            else:
                await self.limiter.hit(tenant, "requests", limits.requests_per_minute)
                if path in AUDIO_ROUTES:
                    await self.limiter.check_audio(tenant, limits.audio_seconds_per_day)
        except REDIS_DOWN as exc:
            raise StoreUnreachable(
                f"the limits store is unreachable ({type(exc).__name__})"
            ) from None
        return True

    async def _principal(self, scope: Scope) -> Principal:
        return await self._verify(credential(scope))

    async def _verify(self, found: str | None) -> Principal:
        if found is None:
            raise Unauthorized(
                "authentication required: an API key or a client token "
                "(Authorization: Bearer, or the voice-agent.token. subprotocol)"
            )
        try:
            return await self.keys.principal(found, self.settings.limits)
        except REDIS_DOWN as exc:
            raise StoreUnreachable(f"the key store is unreachable ({type(exc).__name__})") from None

    async def _known(self, scope: Scope) -> bool:
        try:
            await self._principal(scope)
        except VoiceAgentError:
            return False
        return True

    async def _serve_session(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with contextlib.AsyncExitStack() as held:
            try:
                await held.enter_async_context(self._session(scope))
            except VoiceAgentError as exc:
                await self._refuse(scope, receive, send, exc)
                return
            await self.app(scope, receive, send)

    @contextlib.asynccontextmanager
    async def _session(self, scope: Scope) -> AsyncIterator[None]:
        """The tenant's session lease (its concurrent-session limit) for the block, renewed
        while it runs; its audio meter flushed at the end."""
        principal: Principal = scope[PRINCIPAL]
        limit = principal.limits.sessions if principal.limits else None
        lease = f"{self.service}-{uuid.uuid4().hex}"
        await self.limiter.open_session(principal.tenant, limit, lease)
        cutoff = scope.get(CUTOFF)
        renewer = asyncio.create_task(self._renew(principal, lease, cutoff), name="lease-renewer")
        try:
            yield
        finally:
            renewer.cancel()
            meter = scope.get(METER)
            with contextlib.suppress(Exception):
                if isinstance(meter, AudioMeter):
                    await meter.flush()
            with contextlib.suppress(*REDIS_DOWN):
                await self.limiter.close_session(principal.tenant, lease)

    @contextlib.asynccontextmanager
    async def _late(self, scope: Scope, found: str | None) -> AsyncIterator[None]:
        """The door for a credential read after the upgrade (`LATE_PATHS`): checked, counted
        and leased as at the door; a refusal raises (and is counted) before the block."""
        try:
            principal = await self._verify(found)
            counted = await self._count(scope, principal)
        except VoiceAgentError as exc:
            metrics.AUTH_REFUSED.labels(self.service, exc.code).inc()
            raise
        if not counted:  # a relay token: the service in front counts it
            yield
            return
        async with self._session(scope):
            yield

    async def _renew(self, principal: Principal, lease: str, cutoff: Cutoff | None) -> None:
        """Renew the lease every `lease_renew_s`, and check the key is still active: once
        it is revoked, end the connection (`unauthorized`, close 1008) and stop."""
        while True:
            await asyncio.sleep(self.settings.lease_renew_s)
            try:
                await self.limiter.renew_session(principal.tenant, lease)
                if principal.key_id is not None and await self._revoked_key(principal.key_id):
                    await self._revoked(principal, cutoff)
                    return
            except REDIS_FAILED as exc:  # out of reach, or refusing (OOM)
                log.warning("could not renew a session lease: %s", exc)

    async def _revoked_key(self, key_id: str) -> bool:
        """Whether the key is marked revoked. A record not found is not a revocation: a
        Redis that lost it (restarted empty, a replica promoted without it) would otherwise
        cut every open connection of every key; the next upgrade checks it again."""
        found = await self.keys.get(key_id)
        return found is not None and found[0].revoked_at is not None

    async def _revoked(self, principal: Principal, cutoff: Cutoff | None) -> None:
        exc = Unauthorized("the API key of this connection was revoked")
        log.info(
            "ending a connection of tenant %s: key %s revoked", principal.tenant, principal.key_id
        )
        metrics.AUTH_REFUSED.labels(self.service, exc.code).inc()
        metrics.ERRORS.labels(self.service, exc.code).inc()
        if cutoff is not None:
            await cutoff.end(exc)

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, exc: VoiceAgentError
    ) -> None:
        metrics.AUTH_REFUSED.labels(self.service, exc.code).inc()
        metrics.ERRORS.labels(self.service, exc.code).inc()
        response = error_response(exc)
        if scope["type"] == "http":
            await response(scope, receive, send)
            return
        await receive()  # websocket.connect
        if "websocket.http.response" in scope.get("extensions", {}):
            await response(scope, receive, send)
        else:
            await send({"type": "websocket.close", "code": 1008, "reason": exc.code})
