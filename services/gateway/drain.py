"""Drain a gateway before it stops: refuse new sessions, let open ones end, close the rest
with 1012 (service restart) so their clients reconnect elsewhere and resume.

`POST /admin/drain` runs it (loopback callers only); `voice-agent drain` is its client and
the Kubernetes `preStop` hook (docs/kubernetes.md). uvicorn's own SIGTERM path closes every
session with 1012 at once; draining first lets sessions end by themselves during a grace
period, and guarantees that by the time SIGTERM comes nothing is left open.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Protocol

from pydantic import BaseModel

from services.common.service.routes import ServiceState

log = logging.getLogger(__name__)

CLOSE_SERVICE_RESTART = 1012
CLOSE_REASON = "gateway draining: reconnect with ?session_id= to resume"


class Closable(Protocol):
    async def close(self, code: int = 1000, reason: str = "") -> None: ...


class HasChannel(Protocol):
    @property
    def channel(self) -> Closable: ...


class DrainReport(BaseModel):
    """What one drain did: sessions at its start, those that ended within the grace period,
    those closed with 1012, and those still open when it gave up waiting (0 on success)."""

    sessions_at_start: int
    ended_in_grace: int
    closed_1012: int
    remaining: int


class Drainer:
    """One gateway's drain; concurrent callers share the drain in progress."""

    def __init__(self, sessions: Mapping[str, HasChannel], state: ServiceState) -> None:
        self.sessions = sessions
        self.state = state
        self.idle = asyncio.Event()
        self.idle.set()
        self._running: asyncio.Task[DrainReport] | None = None

    def opened(self) -> None:
        """A session was added to `sessions`."""
        self.idle.clear()

    def closed(self) -> None:
        """A session was removed from `sessions`."""
        if not self.sessions:
            self.idle.set()

    async def drain(self, grace_s: float, wait_s: float) -> DrainReport:
        """Drain (or join the drain under way) and report."""
        if self._running is None or self._running.done():
            self._running = asyncio.create_task(self._drain(grace_s, wait_s), name="drain")
        return await asyncio.shield(self._running)

    async def _drain(self, grace_s: float, wait_s: float) -> DrainReport:
        self.state.draining = True  # /ready answers 503 and new sessions are refused
        at_start = len(self.sessions)
        log.info("draining: %d session(s), grace %.0f s", at_start, grace_s)
        await self._until_idle(grace_s)
        left = list(self.sessions.values())
        for session in left:
            await session.channel.close(CLOSE_SERVICE_RESTART, CLOSE_REASON)
        await self._until_idle(wait_s)
        report = DrainReport(
            sessions_at_start=at_start,
            ended_in_grace=max(at_start - len(left), 0),
            closed_1012=len(left),
            remaining=len(self.sessions),
        )
        log.info("drained: %s", report.model_dump())
        return report

    async def _until_idle(self, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self.idle.wait()
