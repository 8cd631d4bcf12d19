"""The capacity plan's full-duplex section, from the committed duplex_steps result."""

from __future__ import annotations

from pathlib import Path

from services.plan.build import build_plan
from services.plan.inputs import load_measurements
from services.plan.model import PlanOptions
from services.plan.render import render_markdown

RESULT = Path(__file__).resolve().parents[2] / "benchmarks/results/duplex_steps_cpu.json"


def test_duplex_steps_give_the_curve_our_memory_and_the_seeds_claims() -> None:
    measurements, _ = load_measurements([RESULT])
    plan = build_plan(measurements, PlanOptions())
    assert plan.duplex is not None and plan.setups == []
    assert [row.batch for row in plan.duplex.steps if row.config == "tiny"][:2] == [1, 2]
    per_session = plan.duplex.state_per_session.value
    assert 1.0 < per_session < 2.0  # GB: Moshi 7B's KV ring of 3000 steps, bf16
    assert 14.0 < plan.duplex.weights.value < 17.0
    theirs = {claim.theirs for claim in plan.duplex.claims}
    assert {"~8.8 GB", "1.6 GB", "7.0 GB"} <= theirs
    assert all(fits.estimate for _, fits in plan.duplex.sessions_by_memory)
    text = render_markdown(plan)
    assert "theirs are claims, not measurements" in text
    assert "no GPU duplex measurement" in text
