"""Sessions per machine as a loadtest measured them (the most within the voice-to-voice
budget with no turn lost), and the turn pace they took."""

from __future__ import annotations

import math
from dataclasses import dataclass

from services.loadtest.capacity import (
    BUDGET_FLOOR_MS,
    Capacity,
    LevelFigures,
    budget_from,
    find_capacity,
    over_budget,
)
from services.plan.figures import Figure, derived, floor_clean, fmt, given, measured
from services.plan.inputs import Loadtest
from services.plan.model import PlanOptions


@dataclass(frozen=True)
class Judged:
    """A loadtest's levels judged by the capacity rule (services/loadtest/capacity.py)."""

    budget: Figure
    within: list[bool]
    """Per level, in the file's order: v2v p95 within the budget, no turn lost."""
    capacity: Capacity
    notes: list[str]


def budget_of(test: Loadtest, options: PlanOptions) -> tuple[Figure, list[str]]:
    """The voice-to-voice p95 budget: --budget-ms, else the one the run used, else the rule
    on the file's one-session level, else the rule's floor."""
    if options.budget_ms is not None:
        return given(options.budget_ms, "ms", "--budget-ms"), []
    if test.budget is not None:
        return measured(test.budget.ms, "ms", test, "budget.ms"), []
    single = next((i for i, lv in enumerate(test.levels) if lv.sessions == 1), None)
    p95 = test.levels[single].stages_ms.get("voice_to_voice") if single is not None else None
    if single is not None and p95 is not None and p95.p95 is not None:
        base = measured(p95.p95, "ms", test, f"levels[{single}].stages_ms.voice_to_voice.p95")
        budget = budget_from(p95.p95)
        assert budget is not None  # a one-session p95 always gives one
        formula = f"{budget.rule} (the file predates budgets: the rule applied to it)"
        return derived(budget.ms, "ms", formula, [base], estimate=False), []
    formula = f"{BUDGET_FLOOR_MS:.0f} ms: no one-session level to apply the rule to"
    note = (
        "no voice-to-voice budget in the file and no one-session level: judged by the rule's "
        f"floor, {BUDGET_FLOOR_MS:.0f} ms; give --budget-ms or run the loadtest with a "
        "one-session level"
    )
    return derived(BUDGET_FLOOR_MS, "ms", formula, [], estimate=True), [note]


def judge_loadtest(test: Loadtest, options: PlanOptions) -> Judged:
    """Each level within the budget or not, and the capacity the rule finds."""
    budget, notes = budget_of(test, options)
    figures = []
    for level in test.levels:
        v2v = level.stages_ms.get("voice_to_voice")
        lost, _ = level.lost()
        figures.append(
            LevelFigures(level.sessions, v2v.p95 if v2v else None, lost, level.refused_sessions)
        )
    within = [over_budget(f, budget.value) is None for f in figures]
    return Judged(budget, within, find_capacity(figures, budget.value), notes)


def measured_sessions(
    test: Loadtest, options: PlanOptions | None = None
) -> tuple[Figure | None, list[str]]:
    """Capacity: the most sessions whose voice-to-voice p95 stayed within the budget with no
    turn lost, every smaller level within too."""
    judged = judge_loadtest(test, options or PlanOptions())
    found, budget = judged.capacity, judged.budget
    notes = list(judged.notes)
    ordered = sorted(level.sessions for level in test.levels)
    if found.over_at is None:
        notes.append(
            f"every level stayed within the {fmt(budget.value)} ms budget: capacity is at least "
            f"{ordered[-1]} sessions; run larger levels to find where it ends"
        )
    else:
        if found.noisy:
            notes.append(
                f"a level above {found.over_at} sessions was within the budget although "
                f"{found.over_at} was not: noisy run; measure again before trusting more"
            )
        over = next(lv for lv in test.levels if lv.sessions == found.over_at)
        grew = over.grows or over.bottleneck
        where = f"; the stage that grew: {grew}" if grew else ""
        notes.append(f"over the budget at {found.over_at} sessions ({found.why}{where})")
    if found.sessions is None or found.index is None:
        notes.append(f"not even {ordered[0]} session(s) stayed within the budget")
        return None, notes
    index, level = found.index, test.levels[found.index]
    _, lost_from = level.lost()
    fields = [f"levels[{index}].sessions", f"levels[{index}].stages_ms.voice_to_voice.p95"]
    if lost_from is not None:
        fields += [f"levels[{index}].{name}" for name in lost_from.split(", ")]
    held = measured(level.sessions, "sessions", test, *fields)
    formula = (
        f"most sessions with voice-to-voice p95 ≤ budget {fmt(budget.value)} ms and no turn "
        f"lost (level {level.sessions}: p95 "
        f"{fmt(level.stages_ms['voice_to_voice'].p95 or 0)} ms)"
    )
    return derived(held.value, "sessions", formula, [held, budget]), notes


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
