"""Capacity as users feel it: the most sessions whose voice-to-voice p95 stays within a
budget with no turn lost.

One rule for the load test (which steps up levels and stops at the first over it) and the
planner (which reads any loadtest file, older ones included). The budget is a setting;
by default 1.5 × the one-session p95, or 1 s, whichever is larger: a session may wait
half again what it waits alone, and nobody is held to less than a second.

A p95 needs turns: the nearest-rank p95 of fewer than 20 values is their largest, one slow
turn. A level with fewer voice-to-voice samples than `MIN_P95_SAMPLES` sets no budget and
gets no verdict from its p95 (`too few turns`); a lost turn or a refused session still puts
it over.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

BUDGET_FACTOR: Final = 1.5
BUDGET_FLOOR_MS: Final = 1000.0
MIN_P95_SAMPLES: Final = 20
"""Voice-to-voice samples a p95 must be of before it sets a budget or a verdict."""

Verdict = Literal["within", "over", "too_few_turns"]


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
    v2v_count: int | None = None
    """Voice-to-voice samples the p95 is of (None: not recorded, as in older files: not
    checked)."""


def too_few_turns(count: int | None) -> str | None:
    """Why a p95 of `count` samples cannot be judged by (None: it can, or the count is not
    known)."""
    if count is None or count >= MIN_P95_SAMPLES:
        return None
    return (
        f"voice-to-voice p95 of {count} turn{'s' if count != 1 else ''}: "
        f"a p95 needs at least {MIN_P95_SAMPLES}"
    )


def verdict(level: LevelFigures, budget_ms: float) -> tuple[Verdict, str | None]:
    """`within` the budget, `over` it (with why), or `too_few_turns` for its p95 to say
    (with why): a refused session, a lost turn or no answer at all is over however few
    the turns."""
    if level.refused_sessions:
        return "over", f"{level.refused_sessions} of {level.sessions} sessions could not connect"
    if level.lost_turns:
        return "over", f"{level.lost_turns} lost turn{'s' if level.lost_turns > 1 else ''}"
    if level.v2v_p95_ms is None:
        return "over", "no turn answered"
    few = too_few_turns(level.v2v_count)
    if few is not None:
        return "too_few_turns", few
    if level.v2v_p95_ms > budget_ms:
        return "over", f"voice-to-voice p95 {level.v2v_p95_ms:.0f} ms > budget {budget_ms:.0f} ms"
    return "within", None


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
    too_few: tuple[int, ...] = ()
    """Levels (their sessions) with too few turns for a p95: neither within nor over, they
    neither count for the capacity nor end it."""


def find_capacity(levels: Sequence[LevelFigures], budget_ms: float) -> Capacity:
    """The capacity of levels run in any order (judged by number of sessions): the most
    sessions within the budget with every smaller level that could be judged within too."""
    ordered = sorted(enumerate(levels), key=lambda pair: pair[1].sessions)
    best: tuple[int, LevelFigures] | None = None
    too_few: list[int] = []
    for position, (index, level) in enumerate(ordered):
        state, why = verdict(level, budget_ms)
        if state == "within":
            best = (index, level)
            continue
        if state == "too_few_turns":
            too_few.append(level.sessions)
            continue
        above = [lv for _, lv in ordered[position + 1 :]]
        noisy = any(verdict(lv, budget_ms)[0] == "within" for lv in above)
        return Capacity(
            sessions=best[1].sessions if best else None,
            at_least=False,
            over_at=level.sessions,
            why=why,
            index=best[0] if best else None,
            noisy=noisy,
            too_few=tuple(too_few),
        )
    why = None
    if best is None and too_few:
        why = f"too few turns at every level for a p95 (at least {MIN_P95_SAMPLES} each)"
    return Capacity(
        sessions=best[1].sessions if best else None,
        at_least=best is not None,
        over_at=None,
        why=why,
        index=best[0] if best else None,
        too_few=tuple(too_few),
    )
