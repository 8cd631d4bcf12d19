"""Uploads refused past their limit before they are read whole (HTTP 413).

An endpoint that takes a multipart upload sees it only once the framework has read and
spooled the whole body (to disk past 1 MB): its own size check comes after a client has
sent as much as it likes. `BodyLimit` refuses the body first: by its `Content-Length` at
once, or, sent chunked, as soon as the bytes read pass the limit.

A JSON endpoint is read whole and parsed before any of its fields is checked (a text's
length, say): it is registered with its own small limit (`json_body_limit` of its longest
text: the TTS service's `/v1/audio/speech`; `POST /v1/sessions` on every service,
services/common/auth/tokens_api.py) and no form margin.
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.common.errors import UploadTooLarge, VoiceAgentError

FORM_MARGIN = 64 * 1024
"""What a multipart body holds besides its file (boundaries, headers, form fields): the
endpoint checks the file itself against the limit, with its own message."""
JSON_CHAR_BYTES = 12
"""The most bytes one character of a JSON string takes (a `\\uXXXX` surrogate pair)."""


def json_body_limit(max_chars: int) -> int:
    """A limit for a JSON body that carries a text of up to `max_chars` characters."""
    return JSON_CHAR_BYTES * max_chars + FORM_MARGIN


class TooLarge(HTTPException):
    """A body refused past its limit: an HTTPException (FastAPI passes one raised while it
    reads a body on as it is) that carries the typed error the client gets."""

    def __init__(self, error: VoiceAgentError) -> None:
        super().__init__(413, error.message)
        self.error = error


class BodyLimit:
    """An ASGI middleware: POST bodies to `limits`' paths of at most their bytes (plus
    `margin`: a form's parts besides its file; 0 for a JSON body)."""

    def __init__(
        self,
        app: ASGIApp,
        limits: Mapping[str, int],
        margin: int = FORM_MARGIN,
        what: str = "the upload",
        error: type[VoiceAgentError] = UploadTooLarge,
    ) -> None:
        """`error`: what the refusal is (an upload's `invalid_audio`; a JSON body's
        `invalid_message`: `BodyTooLarge`), always HTTP 413."""
        self.app = app
        self.limits = dict(limits)
        self.margin = margin
        self.what = what
        self.error = error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self.limits.get(scope.get("path", "")) if scope["type"] == "http" else None
        if limit is None or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        most = limit + self.margin
        refused = TooLarge(self.error(f"{self.what} exceeds the limit of {limit} bytes"))
        declared = dict(scope.get("headers") or []).get(b"content-length")
        too_big = declared is not None and declared.isdigit() and int(declared) > most
        read = 0

        async def limited() -> Message:
            """The body, refused once past the limit: at once when its declared length is
            (nothing of it read), else as soon as the bytes read are. Raised from the body,
            the refusal is the app's own error reply (typed, counted as every error is)."""
            nonlocal read
            if too_big:
                raise refused
            message = await receive()
            if message["type"] == "http.request":
                read += len(message.get("body", b""))
                if read > most:  # FastAPI passes an HTTPException from the body on as it is
                    raise refused
            return message

        await self.app(scope, limited, send)
