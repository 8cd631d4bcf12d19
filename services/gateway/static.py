"""The browser client at `/` (files in `static/`, no build step) and `GET /v1/voices`.

The page lists voices from the gateway's own origin: `GET /v1/voices` here is the TTS
service's list, fetched from `tts_url` (the gateway never imports the TTS service) on the
caller's behalf with a relay token (services/common/auth/relay.py, as the duplex backend's
sessions): the TTS service checks it too and lists that tenant's voices, without counting
the request a second time against the tenant's limits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response
from starlette.routing import Mount
from starlette.types import Scope

from services.common.auth.api_keys import KeyStore
from services.common.auth.relay import relay_headers
from services.common.errors import TtsUnavailable
from services.gateway.settings import GatewaySection

STATIC_DIR = Path(__file__).parent / "static"
_HEADERS = {
    # connect-src 'self' covers the page's own ws:/wss: to the same host (CSP Level 3, as
    # browsers implement it: tests/e2e/test_browser.py checks it in Chromium)
    "Content-Security-Policy": (
        "default-src 'self'; connect-src 'self'; media-src 'self' blob:; "
        "img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "X-Frame-Options": "DENY",  # frame-ancestors for browsers that predate it
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # revalidate every time (ETag/Last-Modified make it cheap): a gateway upgraded under an
    # open tab must not leave it running yesterday's app.js against today's protocol
    "Cache-Control": "no-cache",
}


class _PageFiles(StaticFiles):
    """The page's files, each with the page's headers (CSP, no framing, no-cache)."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(_HEADERS)
        return response


def static_router(section: GatewaySection, keys: KeyStore) -> APIRouter:
    """Routes of the browser page and the voice list (`keys` signs its relay tokens)."""
    router = APIRouter()

    if section.web_client:

        @router.get("/", include_in_schema=False)
        async def index() -> FileResponse:
            return FileResponse(STATIC_DIR / "index.html", headers=_HEADERS)

        @router.get("/demo", include_in_schema=False)
        async def demo() -> RedirectResponse:
            return RedirectResponse("/", headers=_HEADERS)

        router.routes.append(Mount("/static", _PageFiles(directory=STATIC_DIR), name="static"))

    @router.get("/v1/voices", response_model=None)
    async def voices(request: Request) -> dict[str, Any] | JSONResponse:
        if section.tts_url is None:
            raise TtsUnavailable("this gateway has no tts_url: it cannot list voices")
        url = f"{section.tts_url.rstrip('/')}/v1/voices"
        try:
            async with httpx.AsyncClient(timeout=5.0) as client:
                response = await client.get(url, headers=await relay_headers(request, keys))
            if response.status_code in _CALLERS_ERRORS:  # the caller's, not the service's
                return JSONResponse(response.json(), response.status_code, _retry(response))
            response.raise_for_status()
            listed: dict[str, Any] = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise TtsUnavailable(
                f"the TTS service at {section.tts_url} did not list voices"
            ) from exc
        return listed

    return router


_CALLERS_ERRORS = frozenset({401, 403, 429})
"""TTS answers about the caller's credential or limits, passed on as they are."""


def _retry(response: httpx.Response) -> dict[str, str] | None:
    wait = response.headers.get("retry-after")
    return None if wait is None else {"Retry-After": wait}
