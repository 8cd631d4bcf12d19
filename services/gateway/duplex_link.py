"""A gateway session's connection to the full-duplex service (`WS /v1/stream/duplex`).

The gateway is that endpoint's client (docs/duplex.md, "For a gateway backend"): the link
opens at the model's own rate both ways (the gateway resamples for its client, so a client
that changes rates mid-session keeps its model state), and turns what the service says
into typed values: the agent's audio (bytes), its text (`TextDelta`), or the one error the
session ends with. The service's refusals keep their meaning for the client: no slot is
`CapacityError` (close 1013, with the service's retry hint), a tenant over its limits is
`RateLimited`; anything else the service did is `DuplexUnavailable` (close 1011).

A frozen service (a wedged GPU, a stuck step) keeps its socket open: `watch` ends the
session when the user's audio went there and nothing came back for a while, and a short
keepalive catches one that stops answering pings while no audio flows.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Final

import websockets
from websockets.asyncio.client import ClientConnection, connect

from services.common import metrics as common_metrics
from services.common.errors import (
    CapacityError,
    DuplexUnavailable,
    QuotaExceeded,
    RateLimited,
    VoiceAgentError,
)
from services.common.protocol.duplex import DuplexReady, TextDelta, parse_server
from services.common.protocol.events import ErrorEvent

log = logging.getLogger(__name__)

MODEL_RATE: Final = 24000
"""The rate the link speaks both ways: Mimi's (the service would resample to it anyway)."""
PATH: Final = "/v1/stream/duplex"
_LIMITS: Final = {"rate_limited": RateLimited, "quota_exceeded": QuotaExceeded}
PING_INTERVAL_S: Final = 5.0
PING_TIMEOUT_S: Final = 5.0
"""The link's keepalive (websockets' default: 20 s and 20 s, 40 s of dead air)."""
LEAD_FRAMES: Final = 2
"""Model frames a session's model may take without a word: moshi answers from a session's
third frame (its first is only encoded, its second fills the LM's delays)."""


class DuplexLink:
    """One session's connection to the duplex service; `open` returns it admitted."""

    def __init__(
        self, ws: ClientConnection, ready: DuplexReady, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ws = ws
        self.ready = ready
        self.clock = clock
        self._frame_bytes = 2 * ready.input_sample_rate * ready.frame_ms // 1000
        self._unanswered = 0
        """Bytes sent since the service last said anything."""
        self._unanswered_since: float | None = None
        """When more than the model's lead-in (`LEAD_FRAMES`) was owed an answer."""
        self._listening_since: float | None = None
        """When `receive` began waiting (None: the gateway is not reading the link, its
        client holding it up: the service then rightly holds back its answers)."""
        self._frozen = False

    @classmethod
    async def open(
        cls, base_url: str, headers: dict[str, str], timeout_s: float, max_frame_bytes: int
    ) -> DuplexLink:
        """Connect and wait for `ready` (the session holds a slot); the refusal as a typed
        error otherwise."""
        url = f"{base_url.rstrip('/')}{PATH}?input_sample_rate={MODEL_RATE}"
        url += f"&output_sample_rate={MODEL_RATE}"
        try:
            ws = await connect(
                url,
                additional_headers=headers,
                open_timeout=timeout_s,
                max_size=max_frame_bytes,
                compression=None,
                close_timeout=2,  # a client's close is answered at once, whatever is behind
                ping_interval=PING_INTERVAL_S,
                ping_timeout=PING_TIMEOUT_S,
            )
        except websockets.InvalidStatus as exc:
            raise _refused(exc.response.status_code, exc.response.headers) from None
        except (OSError, TimeoutError, websockets.InvalidHandshake) as exc:
            raise DuplexUnavailable(
                f"the duplex service at {base_url} is unreachable ({type(exc).__name__})"
            ) from None
        try:
            async with asyncio.timeout(timeout_s):
                first = await _next(ws)
            if not isinstance(first, DuplexReady):
                raise DuplexUnavailable("the duplex service did not start the session")
        except TimeoutError:
            await ws.close()
            raise DuplexUnavailable(
                f"the duplex service did not start the session within {timeout_s:g} s"
            ) from None
        except BaseException:
            await ws.close()
            raise
        return cls(ws, first)

    async def send(self, pcm: bytes) -> None:
        """The user's audio (PCM16 at `ready.input_sample_rate`); waits while the service
        is behind (TCP backpressure)."""
        self._unanswered += len(pcm)
        owed = self._unanswered > LEAD_FRAMES * self._frame_bytes
        if owed and self._unanswered_since is None:
            self._unanswered_since = self.clock()
        try:
            await self.ws.send(pcm)
        except websockets.ConnectionClosed as exc:
            raise _ended(exc) from None

    async def receive(self) -> bytes | TextDelta:
        """The agent's next audio frame (PCM16 at `ready.output_sample_rate`) or text."""
        self._listening_since = self.clock()
        try:
            item = await _next(self.ws)
        finally:
            self._listening_since = None
        self._unanswered, self._unanswered_since = 0, None
        if isinstance(item, DuplexReady):
            raise DuplexUnavailable("the duplex service started the session twice")
        return item

    def listening(self) -> bool:
        """Whether `receive` is waiting for the service."""
        return self._listening_since is not None

    def silent_for(self) -> float:
        """Seconds the service has said nothing while audio sent to it waited for an answer
        (more than the model's lead-in) and the gateway listened: 0 when no such audio
        waits, or the gateway is not reading (its client holds it up)."""
        if self._unanswered_since is None or self._listening_since is None:
            return 0.0
        return self.clock() - max(self._unanswered_since, self._listening_since)

    async def watch(self, stall_s: float) -> None:
        """Raise DuplexUnavailable once the service has been silent (`silent_for`) for
        `stall_s`: it answers every model frame, so it is frozen (a task beside the
        session's; it never returns otherwise)."""
        while True:
            # a tick, not an event per frame: what it looks for is nothing happening
            await asyncio.sleep(stall_s / 4)
            if self.silent_for() >= stall_s:
                self._frozen = True
                raise DuplexUnavailable(
                    f"the duplex service answered nothing for {stall_s:g} s while the "
                    "session's audio went to it: it is frozen or overloaded"
                )

    async def close(self) -> None:
        """End the session there (the slot is freed at once). A frozen service would not
        answer the close either: its connection is dropped, not waited for."""
        if self._frozen:
            self.ws.transport.abort()
        else:
            await self.ws.close()


async def _next(ws: ClientConnection) -> bytes | TextDelta | DuplexReady:
    """The service's next audio frame or event; its fatal error or its close as ours."""
    while True:
        try:
            message = await ws.recv()
        except websockets.ConnectionClosed as exc:
            raise _ended(exc) from None
        if isinstance(message, bytes):
            return message
        try:
            event = parse_server(message)
        except VoiceAgentError as exc:
            raise DuplexUnavailable(
                f"the duplex service sent a message the gateway does not take ({exc.message})"
            ) from None
        if not isinstance(event, ErrorEvent):
            return event
        if event.fatal:
            raise _error(event)
        # the gateway checks what it forwards: this is a bug of ours, not the client's
        common_metrics.ERRORS.labels("gateway", f"duplex_{event.code}").inc()
        log.error("the duplex service refused a message: %s: %s", event.code, event.message)


def _ended(exc: websockets.ConnectionClosed) -> VoiceAgentError:
    """Why the service closed the session (it does only when it cannot go on)."""
    received = exc.rcvd
    code = received.code if received is not None else 1006
    reason = received.reason if received is not None else ""
    if code == 1013:
        return CapacityError(reason or "the duplex service is at capacity; retry later")
    detail = f"{code}: {reason}" if reason else str(code)
    return DuplexUnavailable(f"the duplex service ended the session (close {detail})")


def _error(event: ErrorEvent) -> VoiceAgentError:
    """A fatal error of the service as the client's: capacity and the tenant's limits keep
    their meaning, anything else is the service's failure."""
    if event.code == "capacity":
        return CapacityError(event.message)
    limit = _LIMITS.get(event.code)
    if limit is not None:
        return limit(event.message)
    return DuplexUnavailable(f"the duplex service failed: {event.message}")


def _refused(status: int, headers: websockets.datastructures.Headers) -> VoiceAgentError:
    """A handshake the service answered with an HTTP error instead of a session."""
    if status == 429:
        wait = headers.get("retry-after")
        return RateLimited(
            "over the tenant's limits at the duplex service",
            retry_after_s=float(wait) if wait and wait.isdigit() else 1.0,
        )
    if status in (401, 403):
        return DuplexUnavailable(
            f"the duplex service refused the gateway's credential (HTTP {status}): give both "
            "the same VA_AUTH__REQUIRED and VA_AUTH__TOKEN_SECRET (docs/duplex.md)"
        )
    if status == 503:
        return CapacityError("the duplex service is not ready; retry later")
    return DuplexUnavailable(f"the duplex service refused the session (HTTP {status})")
