"""Admission from what the engines can serve: a new session is refused when it would push
the sessions already here past their voice-to-voice budget.

Capacity is what users feel (docs/capacity.md): the most sessions whose voice-to-voice p95
stays within a budget. The gateway measures its own voice-to-voice on every answered turn
(end of the user's speech → first agent audio frame sent), which holds every queue the turn
waited in: the VAD's, the shared ASR and TTS services' (whichever gateway filled them), the
bus. Over the last `window_s` seconds it takes the p95 of those turns and adds what one
more session would cost, and what the sessions admitted in that window will cost once
their turns are in (a burst of newcomers has not yet shown in the p95): each the growth
over the lowest p95 it has seen (its unloaded time) shared out over the sessions the
window does show,

    per session = (p95 − lowest p95) ÷ (sessions open − admitted lately)
    predicted   = p95 + per session × (admitted lately + 1)

The lowest p95 is learned in quiet times only (at most two sessions open): a p95 that
dips under load is noise, not the unloaded time. Until a quiet time was seen it is what a
budget set by the rule implies, budget ÷ `budget_factor`.

and refuses the new session (close 1013, "retry after N s") while the wait it predicts
from load, `predicted − unloaded p95`, is over `close_at` (0.9) of the headroom `budget −
unloaded p95`: a margin, since the straight line undercounts what a session adds near
saturation, where queues grow faster. Once closed it reopens only when that wait falls
below `reopen_at` (0.7) of the headroom: hysteresis, so noise in the p95 does not let a
crowd in (sessions never leave as fast as they come). The budget is the capacity rule's: a
setting, or by default max(`budget_factor` × the lowest p95 seen, `budget_floor_ms`).

Fails open: with no session open (nobody to protect) or fewer than `min_turns` turns in the
window (no evidence), a session is admitted. `max_sessions` stays the hard cap.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Final

from pydantic import BaseModel, Field

from services.common.errors import CapacityError
from services.common.stats import percentile
from services.gateway import metrics

KEEP: Final = 20_000
"""Voice-to-voice samples kept at most (the window rarely holds more)."""
QUIET_SESSIONS: Final = 2
"""The unloaded p95 is learned only while at most this many sessions are open."""


class AdmissionSettings(BaseModel):
    """Admission by measured voice-to-voice (docs/capacity.md#admission)."""

    enabled: bool = True
    """Refuse new sessions while the recent voice-to-voice says one more would pass the budget
    (off: only `max_sessions` limits)."""
    v2v_budget_ms: float | None = Field(default=None, ge=100.0, le=60_000.0)
    """Voice-to-voice p95 budget, ms; unset: max(`budget_factor` × the p95 this gateway
    measured while quiet (at most two sessions), `budget_floor_ms`), the load test's rule
    (no budget, so no refusal, before a quiet time). Set it to the `budget.ms` of your
    loadtest to admit what it measured."""
    budget_factor: float = Field(default=1.5, ge=1.0, le=10.0)
    """Unset budget: this many times the quiet p95 (the unloaded voice-to-voice)."""
    budget_floor_ms: float = Field(default=1000.0, ge=100.0, le=60_000.0)
    """Unset budget: never below this."""
    window_s: float = Field(default=60.0, ge=1.0, le=3600.0)
    """The recent turns: voice-to-voice of the last this many seconds."""
    min_turns: int = Field(default=10, ge=1, le=100_000)
    """Fewer turns than this in the window: no evidence, sessions are admitted."""
    close_at: float = Field(default=0.9, gt=0.0, le=1.0)
    """Refuse when the predicted wait from load passes this share of the headroom (budget −
    unloaded p95): the margin covers the straight-line prediction, which undercounts near
    saturation (queues grow faster)."""
    reopen_at: float = Field(default=0.7, ge=0.0, le=1.0)
    """Once refusing, admit again when the predicted wait from load falls below this share
    of the headroom (hysteresis: noise in the p95 does not let a crowd in)."""
    retry_after_s: int = Field(default=10, ge=1, le=3600)
    """The retry hint a refused client gets."""


class Reading(BaseModel):
    """What admission sees now (also on /health)."""

    enabled: bool
    open: bool
    sessions: int
    turns: int
    """Turns in the window."""
    p95_ms: float | None
    predicted_ms: float | None
    """The p95 with one more session (None: too few turns to tell)."""
    lowest_p95_ms: float | None
    budget_ms: float | None


class Admission:
    """Decides whether one more session may join (`admit`); fed every turn's voice-to-voice
    (`observe`)."""

    def __init__(
        self,
        settings: AdmissionSettings,
        max_sessions: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.max_sessions = max_sessions
        self.clock = clock
        self._samples: deque[tuple[float, float]] = deque(maxlen=KEEP)
        """(clock time, voice-to-voice seconds), oldest first."""
        self._admitted: deque[float] = deque(maxlen=KEEP)
        """Clock times of the sessions admitted lately (their turns may not be in yet)."""
        self._lowest_p95_s: float | None = None
        self.closed = False

    def observe(self, voice_to_voice_s: float) -> None:
        """One answered turn's voice-to-voice, as the gateway measured it."""
        self._samples.append((self.clock(), voice_to_voice_s))

    def budget_s(self) -> float | None:
        """The voice-to-voice p95 budget in seconds (None: not known yet)."""
        s = self.settings
        if s.v2v_budget_ms is not None:
            return s.v2v_budget_ms / 1000
        if self._lowest_p95_s is None:
            return None
        return max(s.budget_factor * self._lowest_p95_s, s.budget_floor_ms / 1000)

    def unloaded_s(self, budget_s: float) -> float:
        """The voice-to-voice p95 with no load: learned in a quiet time, else what the
        budget implies when it was set by the rule (budget ÷ `budget_factor`)."""
        if self._lowest_p95_s is not None:
            return self._lowest_p95_s
        return budget_s / self.settings.budget_factor

    def reading(self, sessions: int) -> Reading:
        """The recent window, the prediction with one more session, and whether it would be
        admitted (updates the hysteresis and the lowest p95)."""
        since = self.clock() - self.settings.window_s
        while self._samples and self._samples[0][0] < since:
            self._samples.popleft()
        while self._admitted and self._admitted[0] < since:
            self._admitted.popleft()
        turns = len(self._samples)
        p95 = predicted = None
        if turns >= self.settings.min_turns:
            p95 = percentile([v for _, v in self._samples], 95)
            quiet = sessions <= QUIET_SESSIONS
            if quiet and (self._lowest_p95_s is None or p95 < self._lowest_p95_s):
                self._lowest_p95_s = p95
        budget = self.budget_s()
        unloaded = None if budget is None else self.unloaded_s(budget)
        if p95 is not None and unloaded is not None:
            recent = min(len(self._admitted), sessions)
            per_session = max(0.0, p95 - unloaded) / max(1, sessions - recent)
            predicted = p95 + per_session * (recent + 1)
        self.closed = self._closes(sessions, predicted, budget, unloaded)
        return Reading(
            enabled=self.settings.enabled,
            open=not self.closed,
            sessions=sessions,
            turns=turns,
            p95_ms=_ms(p95),
            predicted_ms=_ms(predicted),
            lowest_p95_ms=_ms(self._lowest_p95_s),
            budget_ms=_ms(budget),
        )

    def _closes(
        self,
        sessions: int,
        predicted: float | None,
        budget: float | None,
        unloaded: float | None,
    ) -> bool:
        """Closed while the predicted wait from load is over its share of the headroom."""
        s = self.settings
        if not s.enabled or sessions == 0 or predicted is None or budget is None:
            return False
        unloaded = min(unloaded or 0.0, budget)
        share = min(s.reopen_at, s.close_at) if self.closed else s.close_at
        return predicted - unloaded > share * (budget - unloaded)

    def admit(self, sessions: int) -> None:
        """Let one more session join `sessions` open ones, or raise CapacityError (1013) with
        a retry hint in its message (the close reason)."""
        retry = self.settings.retry_after_s
        if sessions >= self.max_sessions:
            metrics.SESSIONS_REFUSED.labels("capacity").inc()
            raise CapacityError(
                f"gateway at capacity, retry after {retry} s: {sessions} sessions "
                "(VA_GATEWAY__MAX_SESSIONS)",
                retry_after_s=retry,
            )
        reading = self.reading(sessions)
        if reading.open:
            self._admitted.append(self.clock())
            return
        metrics.SESSIONS_REFUSED.labels("budget").inc()
        raise CapacityError(
            f"gateway at capacity, retry after {retry} s: voice-to-voice p95 "
            f"{reading.p95_ms:.0f} ms, {reading.predicted_ms:.0f} ms with one more session, "
            f"budget {reading.budget_ms:.0f} ms",
            retry_after_s=retry,
        )


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)
