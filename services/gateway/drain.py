"""Drain a gateway before it stops: refuse new sessions, let the turns in flight finish,
save each session, close it with 1012 (service restart) so its client reconnects elsewhere
and resumes.

Two doors lead here. `POST /admin/drain` (loopback callers only; `voice-agent drain` is its
client and the Kubernetes `preStop` hook, docs/kubernetes.md), and SIGTERM: the server
(services/common/service/server.py) runs the drain before uvicorn's own shutdown, which would
otherwise close every session with 1012 at once, mid-utterance and mid-response.

A session is closed as soon as it is between turns (`turn_in_flight` says no twice in a
row): a response still playing, an utterance that has finished and waits for its
transcript or its answer, or a user still speaking, is let finish within the grace period.
Whatever is still in a turn when the grace period ends is closed anyway.

Sessions are closed concurrently, each saved first for at most `SAVE_WAIT_S`: a frozen or
failing-over Redis costs a session its last save (a resume is best effort; the session has
saved at each turn already), never its 1012, and the drain keeps to its budget
(`stop_budget_s`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from pydantic import BaseModel

from services.common.service.routes import ServiceState

if TYPE_CHECKING:
    from services.gateway.session import Session

log = logging.getLogger(__name__)

CLOSE_SERVICE_RESTART = 1012
CLOSE_REASON = "gateway draining: reconnect with ?session_id= to resume"
POLL_S = 0.05
"""How often the drain looks for sessions that came to rest between turns."""
CLOSE_WAIT_S = 5.0
"""After SIGTERM's drain has closed every session: how long their closes get to finish."""
SAVE_WAIT_S = 2.0
"""How long a session's save may hold back its close; then it is closed unsaved (logged).
At most `CLOSE_WAIT_S`: the saves at the end of the grace period fit in the wait after it."""


def stop_budget_s(drain_timeout_s: float) -> float:
    """The longest a gateway takes to stop after SIGTERM: the drain's grace period, the wait
    for the closes (their saves included: `SAVE_WAIT_S` is less), then uvicorn's own graceful
    shutdown (each `drain_timeout_s` at most).
    systemd's TimeoutStopSec and the chart's terminationGracePeriodSeconds cover it
    (tests/unit/test_systemd.py, test_kubernetes.py)."""
    return 2 * drain_timeout_s + CLOSE_WAIT_S


class Closable(Protocol):
    async def close(self, code: int = 1000, reason: str = "") -> None: ...


class HasChannel(Protocol):
    @property
    def channel(self) -> Closable: ...


S = TypeVar("S", bound=HasChannel)


def turn_in_flight(session: Session) -> bool:
    """Whether closing `session` now would cut a turn (`Session.busy`). Between a transcript
    and its response's start it holds for a moment only: the drain asks twice, `POLL_S`
    apart."""
    return session.busy()


class DrainReport(BaseModel):
    """What one drain did: sessions at its start, those that ended by themselves, those it
    closed with 1012 (between turns, or at the end of the grace period in the middle of a
    turn), and those still open when it gave up waiting (0 on success)."""

    sessions_at_start: int
    ended_in_grace: int
    closed_1012: int
    closed_mid_turn: int
    remaining: int


class Drainer(Generic[S]):
    """One gateway's drain; concurrent callers share the drain in progress."""

    def __init__(
        self,
        sessions: Mapping[str, S],
        state: ServiceState,
        busy: Callable[[S], bool] = lambda _: False,
        save: Callable[[S], Awaitable[None]] | None = None,
        save_wait_s: float = SAVE_WAIT_S,
    ) -> None:
        self.sessions = sessions
        self.state = state
        self.busy = busy
        """Whether a session is in the middle of a turn (it is let finish)."""
        self.save = save
        """Saves a session before it is closed, so its client resumes it as it is."""
        self.save_wait_s = save_wait_s
        """How long a save may hold back its session's close."""
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
        """Drain (or join the drain under way) and report: in `grace_s` plus the longer of
        `wait_s` and `save_wait_s` at most."""
        if self._running is None or self._running.done():
            self._running = asyncio.create_task(self._drain(grace_s, wait_s), name="drain")
        return await asyncio.shield(self._running)

    async def _drain(self, grace_s: float, wait_s: float) -> DrainReport:
        self.state.draining = True  # /ready answers 503 and new sessions are refused
        at_start = len(self.sessions)
        log.info("draining: %d session(s), grace %.0f s", at_start, grace_s)
        loop = asyncio.get_running_loop()
        closed: set[str] = set()
        async with asyncio.TaskGroup() as closing:
            await self._between_turns(grace_s, closed, closing)
            grace_over = loop.time()
            mid_turn = [sid for sid in list(self.sessions) if sid not in closed]
            for session_id in mid_turn:
                self._close(session_id, closed, closing)
        await self._until_idle(max(grace_over + wait_s - loop.time(), 0.0))
        report = DrainReport(
            sessions_at_start=at_start,
            ended_in_grace=max(at_start - len(closed), 0),
            closed_1012=len(closed),
            closed_mid_turn=len(mid_turn),
            remaining=len(self.sessions),
        )
        log.info("drained: %s", report.model_dump())
        return report

    async def _between_turns(
        self, grace_s: float, closed: set[str], closing: asyncio.TaskGroup
    ) -> None:
        """Close each session once it rests between turns, until none is left or the grace
        period ends."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        resting: set[str] = set()  # between turns at the last look
        while loop.time() < deadline and any(sid not in closed for sid in self.sessions):
            for session_id, session in list(self.sessions.items()):
                if session_id in closed:
                    continue
                if self.busy(session):
                    resting.discard(session_id)
                elif session_id in resting:
                    self._close(session_id, closed, closing)
                else:
                    resting.add(session_id)
            await self._until_idle(min(POLL_S, max(deadline - loop.time(), 0.0)))

    def _close(self, session_id: str, closed: set[str], closing: asyncio.TaskGroup) -> None:
        """Start saving and closing a session, beside the others'."""
        session = self.sessions.get(session_id)
        if session is None:
            return
        closed.add(session_id)
        closing.create_task(self._save_and_close(session_id, session), name="drain-close")

    async def _save_and_close(self, session_id: str, session: S) -> None:
        await self._save(session_id, session)
        try:
            await session.channel.close(CLOSE_SERVICE_RESTART, CLOSE_REASON)
        except Exception:  # the other sessions' closes go on
            log.exception("session %s: its close with 1012 failed", session_id)

    async def _save(self, session_id: str, session: S) -> None:
        """Save, waiting `save_wait_s` at most: a resume is best effort, the 1012 is not."""
        if self.save is None:
            return
        try:
            async with asyncio.timeout(self.save_wait_s):
                await self.save(session)
        except TimeoutError:
            log.warning(
                "session %s: save given up after %.1f s (Redis not answering): closed unsaved",
                session_id,
                self.save_wait_s,
            )
        except Exception:
            log.exception("session %s could not be saved: closed unsaved", session_id)

    async def _until_idle(self, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self.idle.wait()
