"""Capacity as users feel it: the most sessions whose voice-to-voice p95 stays within a
budget with no turn lost.

One rule for the load test (which steps up levels and stops at the first over it) and the
planner (which reads any loadtest file, older ones included). The budget is a setting;
by default 1.5 × the one-session p95, or 1 s, whichever is larger: a session may wait
half again what it waits alone, and nobody is held to less than a second.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

BUDGET_FACTOR: Final = 1.5
BUDGET_FLOOR_MS: Final = 1000.0


@dataclass(frozen=True)
class Budget:
    """The voice-to-voice p95 a level may reach, and how it was set."""

    ms: float
    rule: str
    single_session_p95_ms: float | None = None


def budget_from(
    single_session_p95_ms: float | None,
    given_ms: float | None = None,
    factor: float = BUDGET_FACTOR,
    floor_ms: float = BUDGET_FLOOR_MS,
) -> Budget | None:
    """The budget: `given_ms` when set, else max(factor × one-session p95, floor); None
    when neither is known."""
    if given_ms is not None:
        return Budget(round(given_ms, 1), "given", single_session_p95_ms)
    if single_session_p95_ms is None:
        return None
    ms = max(factor * single_session_p95_ms, floor_ms)
    rule = f"max({factor:g} × one-session p95 {single_session_p95_ms:.0f} ms, {floor_ms:.0f} ms)"
    return Budget(round(ms, 1), rule, single_session_p95_ms)


@dataclass(frozen=True)
class LevelFigures:
    """What the rule looks at in one level."""

    sessions: int
    v2v_p95_ms: float | None
    lost_turns: int
    refused_sessions: int = 0


def over_budget(level: LevelFigures, budget_ms: float) -> str | None:
    """Why a level is not within the budget (None: it is)."""
    if level.refused_sessions:
        return f"{level.refused_sessions} of {level.sessions} sessions could not connect"
    if level.lost_turns:
        return f"{level.lost_turns} lost turn{'s' if level.lost_turns > 1 else ''}"
    if level.v2v_p95_ms is None:
        return "no turn answered"
    if level.v2v_p95_ms > budget_ms:
        return f"voice-to-voice p95 {level.v2v_p95_ms:.0f} ms > budget {budget_ms:.0f} ms"
    return None


@dataclass(frozen=True)
class Capacity:
    """The most sessions within the budget, with every smaller level within too."""

    sessions: int | None
    """None: not even the smallest level was within."""
    at_least: bool
    """Every level was within: capacity is at least `sessions` (run larger levels)."""
    over_at: int | None
    """The first level over the budget (None: none was)."""
    why: str | None
    """Why that level was over."""
    index: int | None
    """Where `sessions` is in the levels given (None with `sessions`)."""
    noisy: bool = False
    """A level above `over_at` was within again: measure again before trusting more."""


def find_capacity(levels: Sequence[LevelFigures], budget_ms: float) -> Capacity:
    """The capacity of levels run in any order (judged by number of sessions)."""
    ordered = sorted(enumerate(levels), key=lambda pair: pair[1].sessions)
    best: tuple[int, LevelFigures] | None = None
    for position, (index, level) in enumerate(ordered):
        why = over_budget(level, budget_ms)
        if why is None:
            best = (index, level)
            continue
        above = [lv for _, lv in ordered[position + 1 :]]
        noisy = any(over_budget(lv, budget_ms) is None for lv in above)
        return Capacity(
            sessions=best[1].sessions if best else None,
            at_least=False,
            over_at=level.sessions,
            why=why,
            index=best[0] if best else None,
            noisy=noisy,
        )
    return Capacity(
        sessions=best[1].sessions if best else None,
        at_least=best is not None,
        over_at=None,
        why=None,
        index=best[0] if best else None,
    )
