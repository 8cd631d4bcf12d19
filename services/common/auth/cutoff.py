"""Ending a live WebSocket from the door: a connection whose key was revoked while it was
open.

The guard checks a credential at the upgrade; a session then lives on. At each renewal of
its session lease (guard.py) it checks again that the key behind the connection (the API
key, or the one that signed its client token) is still active. When it is not, `Cutoff`
ends the connection in place of the app: on the endpoints that speak this project's own
events (`NATIVE_PATHS`) a fatal `error` `unauthorized` first, then close 1008 with the
reason `unauthorized`; on the others (the OpenAI Realtime and Twilio wire formats, whose
errors have other shapes) the close alone. The app, still running, reads the client's
leaving (`websocket.disconnect`) at its next receive, or at the one under way once the
close is answered or the connection is gone, and ends as it would had the client left; a
frame it sends after that raises OSError, as on a socket that is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

from services.common.errors import VoiceAgentError
from services.common.protocol.events import ErrorEvent

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

NATIVE_PATHS: Final = frozenset(
    {"/v1/stream", "/v1/stream/asr", "/v1/stream/tts", "/v1/stream/duplex"}
)
"""WebSocket endpoints whose clients read this project's `error` events."""
CLOSE_CODE: Final = 1008


class Cutoff:
    """One WebSocket's receive and send, as the app sees them, and a way to end it."""

    def __init__(self, receive: Receive, send: Send, native: bool) -> None:
        self._receive = receive
        self._send = send
        self.native = native
        self._lock = asyncio.Lock()
        self._accepted = False
        self._closed = False
        self._ended = asyncio.Event()

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    async def receive(self) -> Message:
        """The next message from the client; `websocket.disconnect` once ended (a receive
        under way when it ends gets the client's answer to the close, or the server's
        `websocket.disconnect` once the connection is gone: no race, no task per frame)."""
        if not self.ended:
            message = await self._receive()
            if not self.ended:
                return message
        return {"type": "websocket.disconnect", "code": CLOSE_CODE}

    async def send(self, message: Message) -> None:
        """The app's message, passed on until the connection is ended (then a frame
        raises OSError, as a socket that is gone does; a close is dropped)."""
        async with self._lock:
            if self._closed:
                if message["type"] in ("websocket.send", "websocket.accept"):
                    raise OSError("the connection was ended: its key was revoked")
                return
            await self._send(message)
            kind = message["type"]
            self._accepted = self._accepted or kind == "websocket.accept"
            self._closed = kind == "websocket.close"

    async def end(self, exc: VoiceAgentError) -> None:
        """Tell the client (native endpoints) and close 1008; the app reads a disconnect."""
        async with self._lock:
            if not self._closed:
                self._closed = True
                with contextlib.suppress(Exception):  # the client may be gone already
                    if self._accepted and self.native:
                        event = ErrorEvent.of(exc, fatal=True).dump()
                        await self._send({"type": "websocket.send", "text": event})
                    await self._send(
                        {"type": "websocket.close", "code": CLOSE_CODE, "reason": exc.code}
                    )
        self._ended.set()
