"""The fault drill (benchmarks/fault_drill.py) runs: two of its scenarios on fake engines,
so its stack of processes, its spoken load and its scoring keep working between the runs
recorded in benchmarks/results/fault_drill_lite.json (`pytest -m slow` runs them: each
starts a whole stack of processes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.fault_drill import run


@pytest.mark.slow  # its checks are those of tests/e2e: this guards the drill's machinery
async def test_capacity_plus_one_is_refused_and_the_others_lose_nothing(tmp_path: Path) -> None:
    result = await run("fake", 2, ["capacity_plus_one"], tmp_path)
    plus_one = result["scenarios"]["capacity_plus_one"]
    assert "error" not in plus_one, plus_one
    assert plus_one["extra_session_close_code"] == 1013
    assert plus_one["extra_session_events"] == ["capacity"]
    assert plus_one["turns_completed"] >= 2 and plus_one["recovered"]
    assert (plus_one["turns_lost"], plus_one["turns_duplicated"]) == (0, 0)
    assert plus_one["closes_by_code"] == {}


@pytest.mark.slow  # ~40 s of processes; make test checks the same in tests/e2e (issue 22, 1)
async def test_a_tenants_session_resumes_after_a_gateway_crash(tmp_path: Path) -> None:
    result = await run("fake", 1, ["tenant_resume_after_kill9"], tmp_path)
    outcome = result["scenarios"]["tenant_resume_after_kill9"]
    assert outcome["acme_turn"] == "completed", outcome
    assert outcome["acme_resume"] == "resumed", outcome
    assert outcome["default_tenant_resume"] == "refused 403", outcome
