"""Sessions per machine as a loadtest measured them (the most within the voice-to-voice
budget with no turn lost), and the turn pace they took."""

from __future__ import annotations

import math
from dataclasses import dataclass

from services.loadtest.capacity import (
    BUDGET_FLOOR_MS,
    MIN_P95_SAMPLES,
    Capacity,
    LevelFigures,
    Verdict,
    budget_from,
    find_capacity,
    too_few_turns,
    verdict,
)
from services.plan.figures import Figure, derived, floor_clean, fmt, given, measured
from services.plan.inputs import Loadtest
from services.plan.model import PlanOptions


@dataclass(frozen=True)
class Judged:
    """A loadtest's levels judged by the capacity rule (services/loadtest/capacity.py)."""

    budget: Figure
    verdicts: list[Verdict]
    """Per level, in the file's order: `within` (v2v p95 within the budget, no turn lost),
    `over`, or `too_few_turns` for its p95 to say."""
    capacity: Capacity
    notes: list[str]

    @property
    def within(self) -> list[bool]:
        """Per level, in the file's order: within the budget."""
        return [v == "within" for v in self.verdicts]


def budget_of(test: Loadtest, options: PlanOptions) -> tuple[Figure, list[str]]:
    """The voice-to-voice p95 budget: --budget-ms, else the one the run used, else the rule
    on the file's one-session level, else the rule's floor. A budget the rule made from a
    one-session p95 of too few turns (services/loadtest/capacity.py) is not taken: the
    floor, as an ESTIMATE."""
    if options.budget_ms is not None:
        return given(options.budget_ms, "ms", "--budget-ms"), []
    single = next((i for i, lv in enumerate(test.levels) if lv.sessions == 1), None)
    p95 = test.levels[single].stages_ms.get("voice_to_voice") if single is not None else None
    few = too_few_turns(p95.count) if p95 is not None else None
    if test.budget is not None and (test.budget.rule == "given" or few is None):
        return measured(test.budget.ms, "ms", test, "budget.ms"), []
    if few is None and single is not None and p95 is not None and p95.p95 is not None:
        base = measured(p95.p95, "ms", test, f"levels[{single}].stages_ms.voice_to_voice.p95")
        budget = budget_from(p95.p95)
        assert budget is not None  # a one-session p95 always gives one
        formula = f"{budget.rule} (the file predates budgets: the rule applied to it)"
        return derived(budget.ms, "ms", formula, [base], estimate=False), []
    if few is not None and single is not None and p95 is not None:
        field = f"levels[{single}].stages_ms.voice_to_voice.count"
        count = measured(p95.count or 0, "turns", test, field)
        made = (
            f"the run's budget ({fmt(test.budget.ms)} ms) rested on its slowest turn"
            if test.budget is not None
            else "the rule's budget would rest on its slowest turn"
        )
        formula = f"{BUDGET_FLOOR_MS:.0f} ms, the rule's floor: the one-session level's {few}"
        note = (
            f"the one-session level's {few}; {made}, so the plan judges by the rule's floor, "
            f"{BUDGET_FLOOR_MS:.0f} ms (ESTIMATE); give --budget-ms, or rerun the loadtest "
            f"with a one-session level of {MIN_P95_SAMPLES} turns or more"
        )
        return derived(BUDGET_FLOOR_MS, "ms", formula, [count], estimate=True), [note]
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
            LevelFigures(
                level.sessions,
                v2v.p95 if v2v else None,
                lost,
                level.refused_sessions,
                v2v.count if v2v else None,
            )
        )
    verdicts = [verdict(f, budget.value)[0] for f in figures]
    return Judged(budget, verdicts, find_capacity(figures, budget.value), notes)


def measured_sessions(
    test: Loadtest, options: PlanOptions | None = None
) -> tuple[Figure | None, list[str]]:
    """Capacity: the most sessions whose voice-to-voice p95 stayed within the budget with no
    turn lost, every smaller level judged within too (a p95 of too few turns is not)."""
    judged = judge_loadtest(test, options or PlanOptions())
    found, budget = judged.capacity, judged.budget
    notes = list(judged.notes)
    ordered = sorted(level.sessions for level in test.levels)
    if found.too_few:
        notes.append(
            f"no verdict at {', '.join(map(str, found.too_few))} sessions: too few turns for "
            f"a voice-to-voice p95 (at least {MIN_P95_SAMPLES} each); those levels neither "
            "hold nor end the capacity"
        )
    if found.over_at is None and found.sessions is not None:
        notes.append(
            f"every level judged stayed within the {fmt(budget.value)} ms budget: capacity is "
            f"at least {found.sessions} sessions; run larger levels to find where it ends"
        )
    elif found.over_at is not None:
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
        if found.over_at is not None and found.too_few:
            notes.append(f"no level judged below {found.over_at} sessions was within the budget")
        elif found.over_at is not None:
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
    """Turns per session-minute the loadtest's sessions took, at the level that held (else
    at its first level that counted any turn); None: no level counted one."""
    paced = [lv for lv in test.levels if lv.turns_per_s is not None and lv.turns_per_s > 0]
    if not paced:
        return None
    wanted = sessions.value if sessions is not None else paced[0].sessions
    for index, level in enumerate(test.levels):
        if level.sessions == wanted and level.turns_per_s is not None and level.turns_per_s > 0:
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
