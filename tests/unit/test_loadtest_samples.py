"""A p95 of too few turns sets no budget and gives no verdict.

The nearest-rank p95 of fewer than 20 values is their largest: one slow turn. The committed
lite run's budget came from a one-session p95 of 4 turns, and levels of 9 and 19 turns were
judged by theirs. Now such a level is `too_few_turns` (neither within nor over, said in the
report and the JSON), the one-session level goes on until it has 20 turns, and the planner
does not take a budget made from fewer.
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

import pytest

from services.loadtest import cli
from services.loadtest.capacity import (
    MIN_P95_SAMPLES,
    LevelFigures,
    find_capacity,
    verdict,
)
from services.loadtest.level import LevelPart, judge, level_report
from services.loadtest.progress import ProgressLine
from services.loadtest.summary import summary_text
from services.loadtest.user import SessionRun, UserPlan, Window
from services.loadtest.workers import LevelJob, Snapshot
from services.plan.inputs import Loadtest, parse_measurement
from services.plan.model import PlanOptions
from services.plan.sessions import budget_of, measured_sessions
from tests.unit.test_loadtest import run_of

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "plan"


# ---------------------------------------------------------------- the rule


def test_a_p95_of_fewer_than_20_turns_gives_no_verdict() -> None:
    few = LevelFigures(2, 3000.0, 0, v2v_count=9)
    state, why = verdict(few, 1000.0)
    assert state == "too_few_turns"
    assert why == "voice-to-voice p95 of 9 turns: a p95 needs at least 20"
    assert verdict(LevelFigures(2, 900.0, 0, v2v_count=20), 1000.0) == ("within", None)
    # a lost turn, a refused session, no answer: over however few the turns
    assert verdict(LevelFigures(2, 900.0, 1, v2v_count=3), 1000.0)[0] == "over"
    assert verdict(LevelFigures(2, 900.0, 0, 1, v2v_count=3), 1000.0)[0] == "over"
    assert verdict(LevelFigures(2, None, 0, v2v_count=0), 1000.0)[0] == "over"
    # an older file without counts: not checked
    assert verdict(LevelFigures(2, 900.0, 0), 1000.0)[0] == "within"


def test_levels_with_too_few_turns_neither_hold_nor_end_the_capacity() -> None:
    levels = [
        LevelFigures(1, 700.0, 0, v2v_count=4),
        LevelFigures(2, 1400.0, 0, v2v_count=9),  # p95 over the budget, but of 9 turns
        LevelFigures(4, 800.0, 0, v2v_count=40),
        LevelFigures(8, 1100.0, 0, v2v_count=80),
    ]
    found = find_capacity(levels, 1000.0)
    assert (found.sessions, found.over_at, found.too_few, found.noisy) == (4, 8, (1, 2), False)
    none = find_capacity(levels[:2], 1000.0)
    assert none.sessions is None and none.over_at is None and not none.at_least
    assert none.why == "too few turns at every level for a p95 (at least 20 each)"


# ---------------------------------------------------------------- the load test


def level_of(sessions: int, turns: int, v2v_s: float = 1.0) -> dict[str, Any]:
    part = LevelPart()
    for _ in range(turns):
        part.add_session(run_of(v2v_s))
    return level_report(part, sessions, 60.0, engine_ms=None, server={})


def test_a_level_of_too_few_turns_is_marked_so_in_the_report() -> None:
    level = level_of(2, 9)
    assert judge(level, 2000.0) == "too_few_turns"
    assert level["within_budget"] is None and level["over_budget"] is None
    assert level["too_few_turns"] == "voice-to-voice p95 of 9 turns: a p95 needs at least 20"
    result = {
        "levels": [level],
        "budget": {"ms": 2000.0, "rule": "given"},
        "capacity": cli.capacity_of([level], None),
        "contract_violations": [],
        "ok": True,
    }
    text = summary_text(result)
    assert "no verdict: voice-to-voice p95 of 9 turns" in text.splitlines()[0]
    assert "no verdict at 2 sessions: too few turns for a voice-to-voice p95" in text


def args_of(*words: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(words))


def _levels(monkeypatch: pytest.MonkeyPatch, turns: dict[int, int]) -> list[int]:
    """`_run_level` replaced: each level answers `turns[sessions]` turns in 1 s."""
    ran: list[int] = []

    def fake(_args: Any, _plan: Any, _services: Any, sessions: int, *_: Any) -> dict[str, Any]:
        ran.append(sessions)
        return level_of(sessions, turns[sessions])

    monkeypatch.setattr(cli, "_run_level", fake)
    return ran


def test_a_one_session_level_of_too_few_turns_makes_no_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran = _levels(monkeypatch, {1: 4, 2: 40})
    args = args_of("--sessions", "1,2")
    levels, budget = cli._run_levels(args, UserPlan("ws://x", ()), cli.Services({}))
    assert budget is None and ran == [1]
    why = cli.capacity_of(levels, budget)["why"]
    assert why.startswith("no budget: the one-session level's voice-to-voice p95 of 4 turns")
    assert "--baseline-turns" in why


def test_a_level_of_too_few_turns_does_not_end_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    ran = _levels(monkeypatch, {1: 20, 2: 9, 4: 40})
    levels, budget = cli._run_levels(
        args_of("--sessions", "1,2,4"), UserPlan("ws://x", ()), cli.Services({})
    )
    assert budget is not None and budget.single_session_p95_ms == 1010.0  # 20 turns of 1010 ms
    assert ran == [1, 2, 4]
    assert [lv["within_budget"] for lv in levels] == [True, None, True]
    capacity = cli.capacity_of(levels, budget)
    assert (capacity["sessions"], capacity["at_least"]) == (4, True)


def test_the_one_session_level_goes_on_until_it_has_its_turns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    windows: list[Window] = []

    async def fake_run_local(job: LevelJob, _progress: Any) -> LevelPart:
        windows.append(job.timeline)
        return LevelPart()

    monkeypatch.setattr(cli, "run_local", fake_run_local)
    args = args_of("--sessions", "1,2", "--ramp", "0", "--duration", "1")
    for sessions in (1, 2):
        cli._run_level(args, UserPlan("ws://x", ()), cli.Services({}), sessions, None, _quiet())
    assert [(w.min_turns, w.max_extra_s) for w in windows] == [
        (MIN_P95_SAMPLES, cli.BASELINE_MAX_EXTRA_S),
        (0, 0.0),
    ]
    off = args_of("--sessions", "1", "--baseline-turns", "0", "--ramp", "0", "--duration", "1")
    cli._run_level(off, UserPlan("ws://x", ()), cli.Services({}), 1, None, _quiet())
    assert windows[-1].min_turns == 0


def _quiet() -> Any:
    class Quiet:
        def start_level(self, _timeline: Window) -> None: ...
        def end_level(self) -> None: ...
        def __call__(self, _snapshot: Any) -> None: ...

    return Quiet()


def test_a_window_stays_open_past_its_end_until_its_turns_are_in() -> None:
    window = Window(100.0, 5.0, 30.0, 1, min_turns=20, max_extra_s=300.0)
    assert window.until == 135.0
    assert window.open_for(134.0, 3)
    assert window.open_for(200.0, 19) and not window.open_for(200.0, 20)
    assert not window.open_for(435.0, 3)  # at most 300 s more
    assert not Window(100.0, 5.0, 30.0, 1).open_for(135.0, 0)


def test_the_progress_line_says_the_level_goes_on_for_its_turns() -> None:
    line = ProgressLine(io.StringIO())
    line.start_level(Window(0.0, 0.0, 30.0, 1, min_turns=20, max_extra_s=300.0))
    assert "measuring on to 20 turns" in line.text(Snapshot(up=1, turns=12), 40.0)
    assert "finishing turns" in line.text(Snapshot(up=1, turns=20), 40.0)


def test_a_level_that_went_on_counts_its_whole_window() -> None:
    part = LevelPart()
    run = run_of(1.0)
    run.window_extra_s = 30.0
    part.add_session(run)
    other = LevelPart()
    other.add_session(SessionRun(run.conversation, [], window_extra_s=10.0))
    part.merge(other)
    level = level_report(part, 1, 30.0, engine_ms=None, server={})
    assert level["duration_s"] == 60.0 and level["turns_per_s"] == pytest.approx(1 / 60, abs=1e-3)


# ---------------------------------------------------------------- the planner


def _lite(one_session_turns: int, budget: dict[str, Any] | None) -> Loadtest:
    raw = json.loads((FIXTURES / "loadtest_lite.json").read_text())
    raw["budget"] = budget
    first = raw["levels"][0]
    first["turns"] = first["turns_completed"] = one_session_turns
    first["stages_ms"]["voice_to_voice"]["count"] = one_session_turns
    parsed = parse_measurement(raw, "loadtest_few.json")
    assert isinstance(parsed, Loadtest)
    return parsed


@pytest.mark.parametrize(
    "budget", [None, {"ms": 2160.0, "rule": "max(1.5 × one-session p95 1440 ms, 1000 ms)"}]
)
def test_the_plan_takes_no_budget_made_from_a_p95_of_too_few_turns(
    budget: dict[str, Any] | None,
) -> None:
    test = _lite(4, budget)
    figure, notes = budget_of(test, PlanOptions())
    assert figure.value == 1000.0 and figure.estimate  # the rule's floor
    assert [s.field for s in figure.sources] == ["levels[0].stages_ms.voice_to_voice.count"]
    assert "voice-to-voice p95 of 4 turns" in notes[0] and "--budget-ms" in notes[0]
    held, notes = measured_sessions(test)
    # by the floor: 5 sessions (p95 1550 ms) are over it; level 1 cannot be judged
    assert held is None
    assert any(note.startswith("no verdict at 1 sessions") for note in notes)
    assert "no level judged below 5 sessions was within the budget" in notes
    given = budget_of(_lite(4, {"ms": 2160.0, "rule": "given"}), PlanOptions())[0]
    assert given.value == 2160.0 and not given.estimate  # a budget given is no p95's
