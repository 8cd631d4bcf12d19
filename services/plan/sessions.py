"""Sessions per machine as a loadtest measured them, and the turn pace they took."""

from __future__ import annotations

import math

from services.plan.figures import Figure, derived, floor_clean, fmt, given, measured
from services.plan.inputs import Level, Loadtest
from services.plan.model import PlanOptions


def measured_sessions(test: Loadtest) -> tuple[Figure | None, list[str]]:
    """The largest level that stayed real time with every smaller level real time too."""
    notes: list[str] = []
    ordered = sorted(enumerate(test.levels), key=lambda pair: pair[1].sessions)
    best: tuple[int, Level] | None = None
    broke: Level | None = None
    for index, level in ordered:
        if not level.realtime_ok:
            broke = level
            break
        best = (index, level)
    if broke is None:
        notes.append(
            f"every level stayed real time: capacity is at least {ordered[-1][1].sessions} "
            "sessions; run larger levels to find where it breaks"
        )
    else:
        if any(lv.realtime_ok and lv.sessions > broke.sessions for lv in test.levels):
            notes.append(
                f"a level above {broke.sessions} sessions stayed real time although "
                f"{broke.sessions} did not: noisy run; measure again before trusting more"
            )
        where = f" (bottleneck: {broke.bottleneck})" if broke.bottleneck else ""
        notes.append(f"broke at {broke.sessions} sessions{where}")
    if best is None:
        notes.append(f"not even {ordered[0][1].sessions} session(s) stayed real time")
        return None, notes
    index, level = best
    fields = (f"levels[{index}].sessions", f"levels[{index}].realtime_ok")
    return measured(level.sessions, "sessions", test, *fields), notes


def loadtest_pace(test: Loadtest, sessions: Figure | None) -> Figure | None:
    """Turns per session-minute the loadtest's sessions took, at the level that held."""
    wanted = sessions.value if sessions is not None else test.levels[0].sessions
    for index, level in enumerate(test.levels):
        if level.sessions == wanted and level.turns_per_s is not None:
            per_min = level.turns_per_s / level.sessions * 60
            inputs = [
                measured(level.turns_per_s, "turns/s", test, f"levels[{index}].turns_per_s"),
                measured(level.sessions, "sessions", test, f"levels[{index}].sessions"),
            ]
            formula = (
                f"turns_per_s ÷ sessions × 60 = {fmt(level.turns_per_s)} ÷ {level.sessions} × 60"
            )
            return derived(per_min, "turns/session-min", formula, inputs, estimate=False)
    return None


def rescaled(held: Figure, pace: Figure, options: PlanOptions) -> Figure | None:
    """ESTIMATE: the measured sessions at --turns-per-minute instead of the loadtest's pace."""
    if options.turns_per_minute is None or math.isclose(options.turns_per_minute, pace.value):
        return None
    wanted = given(options.turns_per_minute, "turns/session-min", "--turns-per-minute")
    value = floor_clean(held.value * pace.value / wanted.value)
    formula = (
        "floor(measured sessions × loadtest turns per session-minute ÷ --turns-per-minute) = "
        f"floor({fmt(held.value)} × {fmt(pace.value)} ÷ {fmt(wanted.value)}); "
        "assumes the per-turn work is what limits"
    )
    return derived(value, "sessions", formula, [held, pace, wanted], estimate=True)
