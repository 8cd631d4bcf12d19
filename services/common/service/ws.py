"""WebSocket edge helpers: one serialized sender, frame reception, error mapping.

`Channel` is the socket I/O of every WebSocket; the ASR and TTS streams speak their native
events through it directly, the gateway puts a codec on it (services/gateway/codec.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from services.common import metrics
from services.common.errors import FrameTooBig, InternalError, VoiceAgentError
from services.common.protocol.events import ErrorEvent, Event

log = logging.getLogger(__name__)


class Disconnected(Exception):
    """The peer went away."""


@contextlib.asynccontextmanager
async def failing_typed(
    fail: Callable[[VoiceAgentError], Awaitable[None]],
    what: str,
    gone: tuple[type[Exception], ...] = (Disconnected,),
) -> AsyncIterator[None]:
    """Serve a connection (a task group, usually) so that however it ends, the client is
    told in its protocol: the client gone (`gone`) ends it quietly; a domain error is
    `fail`ed as it is (its `error`, then its close code); anything else is a bug, logged
    here as `what` failed, and the client reads a fatal `internal` error naming only its
    kind, then 1011: never a bare close."""
    try:
        yield
    except* gone:
        pass
    except* VoiceAgentError as group:
        await fail(group.exceptions[0])  # type: ignore[arg-type]
    except* Exception as group:
        log.error("%s failed", what, exc_info=group.exceptions[0])
        await fail(InternalError.of(group.exceptions[0]))


@dataclass(frozen=True, slots=True)
class Frame:
    """One received frame: exactly one of text/data is set."""

    text: str | None = None
    data: bytes | None = None


class Channel:
    """A WebSocket whose sends are serialized (many tasks write to one socket)."""

    def __init__(self, ws: WebSocket, service: str, max_frame_bytes: int) -> None:
        self.ws = ws
        self.service = service
        self.max_frame_bytes = max_frame_bytes
        self._lock = asyncio.Lock()
        self.closed = False

    async def receive(self) -> Frame:
        """The next frame; Disconnected when the peer closed; FrameTooBig above the cap.

        Once a send found the peer gone (its close was answered by the server's protocol
        at once), frames still queued behind it are not read: the connection's work stops
        then, not after a backlog of audio it will never answer."""
        if self.closed:
            raise Disconnected
        message = await self.ws.receive()
        if message["type"] == "websocket.disconnect":
            self.closed = True
            raise Disconnected
        data = message.get("bytes")
        if data is not None:
            if len(data) > self.max_frame_bytes:
                raise FrameTooBig(f"frame of {len(data)} bytes exceeds {self.max_frame_bytes}")
            return Frame(data=data)
        text = message.get("text") or ""
        if len(text) > self.max_frame_bytes:
            raise FrameTooBig(f"message of {len(text)} characters is too big")
        return Frame(text=text)

    async def send(self, event: Event) -> None:
        await self.send_text(event.dump())

    async def send_audio(self, data: bytes) -> None:
        await self.send_bytes(data)

    async def send_bytes(self, data: bytes) -> None:
        """One binary frame (dropped once the peer is gone)."""
        async with self._lock:
            if self.closed:
                return
            try:
                await self.ws.send_bytes(data)
            except (WebSocketDisconnect, RuntimeError, OSError):
                self.closed = True

    async def send_error(
        self, exc: VoiceAgentError, request_id: str | None = None, fatal: bool | None = None
    ) -> None:
        """Report a domain error as an `error` event (and count it).

        `fatal` overrides the error's own flag: a capacity error that refuses one request
        on a connection that goes on is not fatal there.
        """
        metrics.ERRORS.labels(self.service, exc.code).inc()
        await self.send(ErrorEvent.of(exc, fatal, request_id))

    async def close(self, code: int = 1000, reason: str = "") -> None:
        async with self._lock:
            if self.closed or self.ws.application_state == WebSocketState.DISCONNECTED:
                self.closed = True
                return
            self.closed = True
            try:
                await self.ws.close(code, reason[:120])
            except (RuntimeError, OSError):
                log.debug("close after disconnect", exc_info=True)

    async def fail(self, exc: VoiceAgentError) -> None:
        """A fatal error: tell the client, then close with the error's close code."""
        await self.send_error(exc)
        await self.close(exc.close_code, exc.message)

    async def send_text(self, text: str) -> None:
        """One text frame (dropped once the peer is gone)."""
        async with self._lock:
            if self.closed:
                return
            try:
                await self.ws.send_text(text)
            except (WebSocketDisconnect, RuntimeError, OSError):
                self.closed = True


READ_AHEAD_BYTES = 2 << 20
"""What a connection reads ahead of its handling by default: ~40 s of 24 kHz PCM16, so a
close is read at once while the handling waits, for a client sending in real time."""


class ReadAhead:
    """Frames read from a socket ahead of their handling, at most `max_bytes` of them.

    A task that reads the socket into it at once (`read`) keeps the server reading, so a
    client's close is read and answered while the handling waits (on Redis, say): a server
    whose application leaves a message unread stops reading the socket, and a close queued
    behind it waits as long. The handling then ends at its next `get`; it is not cancelled
    (a Redis client may turn a cancellation into an error of its own, and the handling would
    then wait for a frame forever). A client that sends faster than it is handled is held
    back at the bound, as TCP would hold it back."""

    def __init__(self, max_bytes: int = READ_AHEAD_BYTES) -> None:
        self.max_bytes = max_bytes
        self._frames: deque[Frame] = deque()
        self._bytes = 0
        self._ended = False
        self._changed = asyncio.Condition()

    async def read(self, channel: Channel) -> None:
        """Read `channel` into this until the peer leaves; `get` then raises Disconnected,
        whatever is still queued (the connection's work stops at its close). A fatal frame
        (FrameTooBig) ends it too, and is raised here."""
        try:
            while True:
                await self.put(await channel.receive())
        except Disconnected:
            pass
        finally:
            await self.end()

    async def put(self, frame: Frame) -> None:
        size = _size(frame)
        async with self._changed:
            await self._changed.wait_for(
                lambda: not self._frames or self._bytes + size <= self.max_bytes
            )
            self._frames.append(frame)
            self._bytes += size
            self._changed.notify_all()

    async def end(self) -> None:
        """End the handling as the peer's leaving would (the connection is taken over)."""
        self._ended = True
        async with self._changed:
            self._changed.notify_all()

    async def get(self) -> Frame:
        """The next frame; Disconnected once the peer has left."""
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self._frames) or self._ended)
            if self._ended:
                raise Disconnected
            frame = self._frames.popleft()
            self._bytes -= _size(frame)
            self._changed.notify_all()
            return frame


def _size(frame: Frame) -> int:
    return len(frame.data) if frame.data is not None else len(frame.text or "")
