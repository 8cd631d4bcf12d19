"""`voice-agent plan`: the turn pace a loadtest ran at, and how the plan converts sessions to
turns with it.

A level that counted no turn (`turns_per_s: 0`) gives no pace; and in the many-hosts view each
measured host converts sessions to turns at the pace of its own loadtest, so the view does
not depend on the order the files are given in.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from services.plan.build import build_plan
from services.plan.inputs import Loadtest, Measurement, load_measurements, parse_measurement
from services.plan.model import PlanOptions
from services.plan.render import render_markdown
from services.plan.sessions import loadtest_pace

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "plan"
LITE = FIXTURES / "loadtest_lite.json"
GPU = FIXTURES / "loadtest_dual_gpu.json"
FAKE = FIXTURES / "loadtest_fake.json"
ASR = FIXTURES / "asr_batching_gpu.json"
TTS = FIXTURES / "tts_stream_gpu.json"


def _no_turns(levels: list[tuple[int, float]]) -> Loadtest:
    """The lite fixture with levels of (sessions, turns/s); a level of 0 turns/s answered none."""
    raw = json.loads(LITE.read_text())
    empty = {"count": 0, "p50": None, "p95": None, "p99": None, "mean": None, "max": None}
    template = raw["levels"][2]
    raw["levels"] = [
        {
            **template,
            "sessions": n,
            "turns_per_s": rate,
            "turns": round(rate * 60),
            "turns_completed": round(rate * 60),
            "stages_ms": template["stages_ms"] if rate else {"voice_to_voice": empty},
        }
        for n, rate in levels
    ]
    parsed = parse_measurement(raw, "loadtest_zero.json")
    assert isinstance(parsed, Loadtest)
    return parsed


def test_a_level_that_counted_no_turn_gives_no_pace() -> None:
    """`voice-agent loadtest --sessions 1 --ramp 5 --duration 1` can count no turn: its pace
    was 0, and the ASR estimate divided by it (ZeroDivisionError)."""
    zero = _no_turns([(1, 0.0)])
    assert loadtest_pace(zero, None) is None
    asr = load_measurements([ASR])[0]
    plan = build_plan([zero, *asr], PlanOptions(users=100, concurrency_ratio=0.1))
    engine_only = next(s for s in plan.setups if s.loadtest is None)
    assert engine_only.pace is None and engine_only.estimates == {}
    assert any("no loadtest pace; give --turns-per-minute" in m for m in engine_only.missing)
    assert plan.multi_host is not None and plan.multi_host.pace is None
    assert "# Capacity plan" in render_markdown(plan)


def test_levels_without_turns_are_skipped_for_the_pace() -> None:
    """No level held (none was within the budget): the pace is the first level's that counted
    turns, not a 0."""
    test = _no_turns([(1, 0.0), (5, 0.5)])
    pace = loadtest_pace(test, None)
    assert pace is not None and pace.value == 6  # 0.5 ÷ 5 × 60
    assert [s.field for s in pace.sources] == ["levels[1].turns_per_s", "levels[1].sessions"]


def _multi_host(paths: list[Path], **options: Any) -> dict[str, Any]:
    found: list[Measurement] = load_measurements(paths)[0]
    plan = build_plan(found, PlanOptions(hosts_for=[1000], **options))
    assert plan.multi_host is not None
    view: dict[str, Any] = json.loads(plan.multi_host.model_dump_json())
    return view


def test_the_many_hosts_view_does_not_depend_on_the_order_of_the_files() -> None:
    """The lite fixture held 10 sessions at 4.2 turns per session-minute, the dual-GPU one 40
    at 3: the view once took one pace from whichever loadtest came first and turned the
    other host's turns/s into sessions at it, unmarked."""
    files = [LITE, GPU, FAKE, ASR, TTS]
    views = [_multi_host(list(order)) for order in itertools.permutations(files)]
    assert all(view == views[0] for view in views[1:])
    rows = views[0]["rows"]
    bases = [basis["label"] for basis in views[0]["engine_bases"]]
    hosts = dict(zip(bases, rows[0]["engine_hosts"], strict=True))
    gpu = next(h for label, h in hosts.items() if "H200" in label and "measured" in label)
    lite = next(h for label, h in hosts.items() if "Intel" in label)
    # each at its own pace: 1000 × 3 ÷ 60 ÷ 2.0 = 25 GPU hosts (1000 ÷ 40), and
    # 1000 × 4.2 ÷ 60 ÷ 0.7 = 100 lite machines (1000 ÷ 10): measured, not ESTIMATE
    assert (gpu["value"], gpu["estimate"]) == (25, False)
    assert (lite["value"], lite["estimate"]) == (100, False)


def test_a_pace_given_for_all_rescales_each_measured_host_as_an_estimate() -> None:
    orders = itertools.permutations([LITE, GPU])
    views = [_multi_host(list(order), turns_per_minute=6) for order in orders]
    assert views[0] == views[1]
    gpu, lite = views[0]["rows"][0]["engine_hosts"]  # GPU hosts first
    # 1000 × 6 ÷ 60 = 100 turns/s: ceil(100 ÷ 2.0) = 50 and ceil(100 ÷ 0.7) = 143, both
    # measured at another pace than 6: rescaled, ESTIMATE
    assert (gpu["value"], gpu["estimate"]) == (50, True)
    assert (lite["value"], lite["estimate"]) == (143, True)
    assert "assumes the per-turn work is what limits" in lite["formula"]
