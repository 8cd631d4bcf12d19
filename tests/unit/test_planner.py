"""`voice-agent plan`: the arithmetic against hand-computed cases, traceability, and the CLI.

The fixtures under tests/fixtures/plan/ are small hand-made measurement files: a lite
loadtest on a 2-core CPU machine written before voice-to-voice budgets (levels 1, 5, 10, 20;
over the rule's budget at 20), a dual-GPU loadtest with its budget (levels 10, 20, 40; all
within) and an asr_batching and a tts_stream file from that GPU machine.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from services.plan.build import build_plan
from services.plan.cli import add_plan_command, main, run
from services.plan.figures import OPTIONS_PATH, Figure
from services.plan.inputs import (
    Loadtest,
    Measurement,
    PlanInputError,
    load_measurements,
    parse_measurement,
)
from services.plan.latency import STAGES
from services.plan.model import Plan, PlanOptions, Setup
from services.plan.render import render_markdown
from services.plan.sessions import measured_sessions
from services.plan.sizing import sizing

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "plan"
LITE = FIXTURES / "loadtest_lite.json"
GPU = FIXTURES / "loadtest_dual_gpu.json"
ASR = FIXTURES / "asr_batching_gpu.json"
TTS = FIXTURES / "tts_stream_gpu.json"
MIB = 1024 * 1024


def load(*paths: Path) -> list[Measurement]:
    return load_measurements(list(paths))[0]


def setup_for(plan: Plan, path: Path) -> Setup:
    return next(s for s in plan.setups if s.loadtest == str(path))


def plan_of(*paths: Path, **options: Any) -> Plan:
    return build_plan(load(*paths), PlanOptions(**options))


# ---------------------------------------------------------------- sessions per machine


def test_sessions_per_machine_is_the_most_within_the_voice_to_voice_budget() -> None:
    plan = plan_of(LITE, GPU)
    lite, gpu = setup_for(plan, LITE), setup_for(plan, GPU)
    # lite predates budgets: the rule on its one-session p95, max(1.5 × 1440, 1000) = 2160 ms;
    # levels 1, 5, 10 have p95 1440, 1550, 1600 (within), 20 has 3300 (over) -> 10
    assert lite.measured_sessions is not None
    assert lite.measured_sessions.value == 10
    assert not lite.measured_sessions.estimate
    assert [s.field for s in lite.measured_sessions.sources] == [
        "levels[2].sessions",
        "levels[2].stages_ms.voice_to_voice.p95",
        "levels[2].turns",
        "levels[2].turns_completed",
        "levels[0].stages_ms.voice_to_voice.p95",
    ]
    assert (
        "over the budget at 20 sessions (voice-to-voice p95 3300 ms > budget 2160 ms; "
        "the stage that grew: asr)" in lite.notes
    )
    # dual GPU: its own budget (1400 ms); 10, 20, 40 all within -> 40, a lower bound
    assert gpu.measured_sessions is not None and gpu.measured_sessions.value == 40
    assert "budget.ms" in [s.field for s in gpu.measured_sessions.sources]
    assert any("capacity is at least 40" in note for note in gpu.notes)


def _loadtest(levels: list[tuple[int, float, int]], budget_ms: float | None = 1000.0) -> Loadtest:
    """Levels of (sessions, voice-to-voice p95 ms, lost turns), judged by `budget_ms`."""
    raw = json.loads(LITE.read_text())
    if budget_ms is not None:
        raw["budget"] = {"ms": budget_ms, "rule": "given"}
    v2v = raw["levels"][0]["stages_ms"]["voice_to_voice"]
    raw["levels"] = [
        {
            **raw["levels"][0],
            "sessions": n,
            "lost_turns": lost,
            "stages_ms": {"voice_to_voice": {**v2v, "p95": p95}},
        }
        for n, p95, lost in levels
    ]
    parsed = parse_measurement(raw, "synthetic.json")
    assert isinstance(parsed, Loadtest)
    return parsed


def test_a_level_within_the_budget_above_one_over_it_does_not_count() -> None:
    figure, notes = measured_sessions(_loadtest([(1, 700, 0), (5, 1200, 0), (10, 900, 0)]))
    assert figure is not None and figure.value == 1
    assert any("noisy run" in note for note in notes)


def test_a_lost_turn_ends_the_capacity_however_fast_the_answers() -> None:
    figure, notes = measured_sessions(_loadtest([(1, 700, 0), (4, 800, 0), (8, 850, 1)]))
    assert figure is not None and figure.value == 4
    assert "over the budget at 8 sessions (1 lost turn)" in notes


def test_no_level_within_the_budget_means_no_measured_capacity() -> None:
    figure, notes = measured_sessions(_loadtest([(5, 1500, 0), (10, 1800, 0)]))
    assert figure is None
    assert "not even 5 session(s) stayed within the budget" in notes


def test_the_plan_budget_option_judges_every_file_by_it() -> None:
    test = _loadtest([(1, 700, 0), (4, 800, 0), (8, 950, 0)])
    figure, _ = measured_sessions(test)
    assert figure is not None and figure.value == 8  # the file's own 1000 ms
    figure, _ = measured_sessions(test, PlanOptions(budget_ms=900))
    assert figure is not None and figure.value == 4
    assert "--budget-ms" in [s.field for s in figure.sources]


def test_an_old_file_without_a_one_session_level_is_judged_by_the_floor() -> None:
    figure, notes = measured_sessions(_loadtest([(5, 900, 0), (10, 1100, 0)], budget_ms=None))
    assert figure is not None and figure.value == 5 and figure.estimate
    assert any("judged by the rule's floor, 1000 ms" in note for note in notes)


# ---------------------------------------------------------------- memory


def test_memory_is_a_least_squares_line_over_the_levels() -> None:
    lite = setup_for(plan_of(LITE, target_sessions=30), LITE)
    gateway = next(line for line in lite.memory if line.component == "gateway RSS")
    # sessions x = 1, 5, 10, 20 (mean 9); RSS y = 100, 104, 110, 118 MiB (mean 108)
    # Σ(x−x̄)(y−ȳ) = (−8)(−8) + (−4)(−4) + (1)(2) + (11)(10) = 192; Σ(x−x̄)² = 64+16+1+121 = 202
    slope = 192 / 202 * MIB
    fixed = 108 * MIB - 9 * slope
    assert gateway.per_session.value == pytest.approx(slope)
    assert gateway.fixed.value == pytest.approx(fixed)
    assert gateway.levels == [1, 5, 10, 20]
    assert not gateway.per_session.estimate and not gateway.fixed.estimate
    assert gateway.at_target is not None and gateway.at_target.estimate
    assert gateway.at_target.value == pytest.approx(fixed + 30 * slope)
    assert [s.field for s in gateway.per_session.sources] == [
        f"levels[{i}].server.gateway.rss_bytes" for i in range(4)
    ]


def test_gpu_memory_per_session_where_reported() -> None:
    gpu = setup_for(plan_of(GPU), GPU)
    asr_gpu = next(line for line in gpu.memory if line.component == "ASR GPU memory")
    # (10, 3000 MiB), (20, 3100 MiB), (40, 3300 MiB): exactly 2900 MiB + 10 MiB × sessions
    assert asr_gpu.per_session.value == pytest.approx(10 * MIB)
    assert asr_gpu.fixed.value == pytest.approx(2900 * MIB)
    assert asr_gpu.at_target is None  # no --target-sessions


def test_memory_not_sampled_is_said_not_invented() -> None:
    lite = setup_for(plan_of(LITE), LITE)
    assert {line.component for line in lite.memory} == {"gateway RSS", "ASR RSS"}
    assert "ASR GPU memory: not reported (ASR ran on cpu)" in lite.missing
    assert "TTS RSS: TTS not sampled: run the loadtest with --tts-url" in lite.missing


# ---------------------------------------------------------------- latency


def test_latency_at_a_measured_level_is_copied() -> None:
    latency = setup_for(plan_of(LITE, target_sessions=10), LITE).latency
    assert latency is not None
    assert (latency.basis, latency.levels, latency.within_budget) == ("measured", [10], [True])
    v2v = next(s for s in latency.stages if s.stage == "voice_to_voice")
    assert v2v.p95 is not None and v2v.p95.value == 1600 and not v2v.p95.estimate
    assert [s.field for s in v2v.p95.sources] == ["levels[2].stages_ms.voice_to_voice.p95"]
    assert v2v.count == 42
    assert [s.stage for s in latency.stages] == list(STAGES)


def test_latency_between_levels_is_interpolated_and_marked_estimate() -> None:
    latency = setup_for(plan_of(GPU, target_sessions=30), GPU).latency
    assert latency is not None
    assert (latency.basis, latency.levels) == ("interpolated", [20, 40])
    v2v = next(s for s in latency.stages if s.stage == "voice_to_voice")
    # level 20: 700 / 900 / 1000 ms; level 40: 900 / 1300 / 1600 ms; 30 is half way
    assert v2v.p50 is not None and v2v.p95 is not None and v2v.p99 is not None
    assert (v2v.p50.value, v2v.p95.value, v2v.p99.value) == (800, 1100, 1300)
    assert v2v.p95.estimate
    assert v2v.p95.formula is not None and "900 + (1300 − 900) × 10 ÷ 20" in v2v.p95.formula
    assert [s.field for s in v2v.p95.sources] == [
        "levels[1].stages_ms.voice_to_voice.p95",
        "levels[2].stages_ms.voice_to_voice.p95",
    ]


def test_latency_outside_the_levels_is_not_extrapolated() -> None:
    lite = setup_for(plan_of(LITE, target_sessions=30), LITE)
    assert lite.latency is None
    assert any(
        "30 is above the largest measured level (1, 5, 10, 20); not extrapolated" in line
        for line in lite.missing
    )


# ---------------------------------------------------------------- engine estimates


def test_engine_throughput_estimates_show_their_formula() -> None:
    gpu = setup_for(plan_of(GPU, ASR, TTS), GPU)
    # pace from the loadtest's level that held (40 sessions, 2.0 turns/s): 2 ÷ 40 × 60 = 3
    assert gpu.pace is not None and gpu.pace.value == 3
    asr, tts, engines = gpu.estimates["asr"], gpu.estimates["tts"], gpu.estimates["engines"]
    # ASR: best 150 utterances/s (results[2]); floor(150 ÷ (3 ÷ 60 × 1)) = 3000
    assert asr.value == 3000 and asr.estimate
    assert asr.formula is not None and "floor(150 ÷ (3 ÷ 60 × 1))" in asr.formula
    assert "results[2].utterances_per_s" in [s.field for s in asr.sources]
    # TTS: best 24 audio s/s (results[1]), reply 40 s ÷ 8 = 5 s; floor(24 ÷ (5 × 3 ÷ 60)) = 96
    assert tts.value == 96 and tts.estimate
    assert tts.formula is not None and "floor(24 ÷ (5 × 3 ÷ 60))" in tts.formula
    assert engines.value == 96 and engines.estimate


def test_turns_per_minute_rescales_estimates_and_the_measured_level() -> None:
    gpu = setup_for(
        plan_of(GPU, ASR, TTS, turns_per_minute=6, users=400, concurrency_ratio=0.1), GPU
    )
    assert gpu.estimates["asr"].value == 1500  # floor(150 ÷ (6 ÷ 60))
    assert gpu.estimates["tts"].value == 48  # floor(24 ÷ (5 × 6 ÷ 60))
    rescaled = next(s for s in gpu.sizing if s.basis.startswith("measured, rescaled"))
    # floor(40 sessions × 3 turns/min ÷ 6 turns/min) = 20; peak 400 × 0.1 = 40 -> 2 machines
    assert rescaled.sessions_per_machine.value == 20 and rescaled.sessions_per_machine.estimate
    assert rescaled.machines.value == 2 and rescaled.machines.estimate


def test_an_engine_benchmark_of_another_engine_is_not_used() -> None:
    lite = setup_for(plan_of(LITE, ASR, TTS), LITE)  # the loadtest ran sphinx; ASR file is whisper
    assert lite.estimates == {}
    assert any(m.startswith("no ASR engine benchmark for sphinx") for m in lite.missing)
    assert any("no TTS engine benchmark on this machine" in m for m in lite.missing)


# ---------------------------------------------------------------- machines needed


def test_machines_needed_with_headroom() -> None:
    plan = plan_of(LITE, GPU, ASR, TTS, users=1000, concurrency_ratio=0.05, headroom=0.2)
    lite, gpu = setup_for(plan, LITE), setup_for(plan, GPU)
    size = lite.sizing[0]
    assert size.basis.startswith("measured")
    assert size.peak_sessions.value == 50  # 1000 × 0.05
    assert size.machines.value == 5  # ceil(50 ÷ 10)
    assert size.machines_with_headroom is not None
    assert size.machines_with_headroom.value == 6  # ceil(50 × 1.2 ÷ 10)
    assert not size.machines.estimate
    assert size.peak_turns_per_s is not None
    assert size.peak_turns_per_s.value == pytest.approx(3.5)  # 50 × 4.2 ÷ 60
    by_basis = {s.basis: s for s in gpu.sizing}
    measured = by_basis["measured: most sessions within the voice-to-voice budget"]
    assert measured.machines.value == 2  # ceil(50 ÷ 40)
    engines = by_basis["engine throughput"]
    assert engines.machines.value == 1 and engines.machines.estimate  # ceil(50 ÷ 96)


def test_float_noise_does_not_add_a_machine() -> None:
    # 30 × 0.1 is 3.0000000000000004 in floating point: still 3 sessions, 1 machine of 3
    size = sizing(
        [("measured", Figure(value=3, unit="sessions", sources=[]))],
        None,
        PlanOptions(users=30, concurrency_ratio=0.1, headroom=0.0),
        [],
    )[0]
    assert size.peak_sessions.value == 3
    assert size.machines.value == 1
    assert size.machines_with_headroom is None


def test_machines_needed_says_what_option_is_missing() -> None:
    lite = setup_for(plan_of(LITE, users=1000), LITE)
    assert lite.sizing == []
    assert any("without --concurrency-ratio" in m for m in lite.missing)


# ---------------------------------------------------------------- missing inputs


def test_engine_benchmarks_alone_report_what_is_missing() -> None:
    plan = plan_of(ASR, TTS, users=1000, concurrency_ratio=0.05)
    (only,) = plan.setups
    assert only.measured_sessions is None and only.latency is None
    assert only.estimates == {}  # no pace to turn throughput into sessions
    assert only.sizing == []
    assert any(m.startswith("no loadtest on this machine") for m in only.missing)
    assert any("give --turns-per-minute" in m for m in only.missing)
    assert any(m.startswith("no loadtest at all") for m in plan.missing)
    with_pace = plan_of(ASR, TTS, users=1000, concurrency_ratio=0.05, turns_per_minute=3)
    assert with_pace.setups[0].sizing[0].basis == "engine throughput"
    assert with_pace.setups[0].sizing[0].machines.estimate


def test_a_cpu_only_plan_says_there_is_no_gpu_measurement() -> None:
    plan = plan_of(LITE)
    assert any(m.startswith("no GPU measurement") for m in plan.missing)
    assert not plan.setups[0].gpu
    assert "2 cores Intel(R) Xeon(R) Processor, no GPU" in plan.setups[0].title
    assert not any(m.startswith("no GPU measurement") for m in plan_of(LITE, GPU).missing)


# ---------------------------------------------------------------- traceability


def _resolve(document: Any, field: str) -> Any:
    for name, index in re.findall(r"\.?(\w+)|\[(\d+)\]", field):
        document = document[int(index)] if index else document[name]
    return document


def _figures(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, dict):
        found = [node] if {"value", "sources"} <= node.keys() else []
        return found + [f for value in node.values() for f in _figures(value)]
    if isinstance(node, list):
        return [f for value in node for f in _figures(value)]
    return []


def test_every_number_in_the_json_plan_has_a_source() -> None:
    options = {"target_sessions": 30, "users": 1000, "concurrency_ratio": 0.05, "headroom": 0.2}
    plan = json.loads(plan_of(LITE, GPU, ASR, TTS, **options).model_dump_json())
    figures = _figures(plan["setups"])
    assert len(figures) > 50
    files = {str(p): json.loads(p.read_text()) for p in (LITE, GPU, ASR, TTS)}
    for figure in figures:
        assert figure["sources"], figure
        for source in figure["sources"]:
            assert source["field"], figure
            if source["path"] == OPTIONS_PATH:
                continue
            raw = files[source["path"]]
            assert (source["command"], source["timestamp"]) == (raw["command"], raw["timestamp"])
            _resolve(raw, source["field"])  # the field exists in the file
        first = figure["sources"][0]
        if figure["formula"] is None and first["path"] != OPTIONS_PATH:
            # copied, not computed: its first field holds exactly this value
            assert _resolve(files[first["path"]], first["field"]) == figure["value"]
        elif figure["formula"] is None:
            assert len(figure["sources"]) == 1, figure  # an option, as given
        assert not figure["estimate"] or figure["formula"], figure


def test_the_markdown_footnotes_name_file_command_time_machine_and_field() -> None:
    text = render_markdown(plan_of(LITE, GPU, target_sessions=30))
    assert re.search(
        rf"\[\d+\] {re.escape(str(LITE))} — `voice-agent loadtest --sessions 1,5,10,20 "
        r"[^`]*` — 2026-11-22T10:00:00Z — 2 cores Intel\(R\) Xeon\(R\) Processor, no GPU — "
        r"levels\[2\]\.\{sessions,turns,turns_completed\}; "
        r"levels\[2\]\.stages_ms\.voice_to_voice\.p95; levels\[0\]\.stages_ms\.voice_to_voice\.p95",
        text,
    )
    assert "| voice_to_voice | 800 (ESTIMATE) | 1100 (ESTIMATE) | 1300 (ESTIMATE) |" in text
    assert "For this machine and profile only" in text


def test_one_session_latency_from_a_voice_to_voice_benchmark() -> None:
    raw = {
        "command": "python -m benchmarks.voice_to_voice --turns 3",
        "machine": {"cpu": "x", "cores": 2, "gpus": []},
        "timestamp": "2026-11-21T00:00:00Z",
        "benchmark": "voice_to_voice",
        "turns": [
            {"speech_stopped_ms": 600, "transcript_final_ms": 1000, "voice_to_voice_ms": 1010},
            {"speech_stopped_ms": 620, "transcript_final_ms": 1220, "voice_to_voice_ms": 1240},
            {"speech_stopped_ms": 640, "transcript_final_ms": 1440, "voice_to_voice_ms": 1470},
        ],
    }
    parsed = parse_measurement(raw, "v2v.json")
    assert parsed is not None
    (setup,) = build_plan([parsed], PlanOptions()).setups
    stages = {s.stage: s for s in setup.references[0].stages}
    # asr = final − stopped = 400, 600, 800: p50 600, p99 800 (nearest rank)
    asr = stages["asr"]
    assert asr.p50 is not None and asr.p99 is not None
    assert (asr.p50.value, asr.p99.value, asr.count) == (600, 800, 3)
    response = stages["response"]  # 10, 20, 30
    assert response.p50 is not None and response.p50.value == 20


# ---------------------------------------------------------------- files and the CLI


def test_malformed_files_give_an_error_naming_the_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(PlanInputError, match=rf"{re.escape(str(broken))}: not JSON"):
        load_measurements([broken])
    raw = json.loads(LITE.read_text())
    del raw["levels"][1]["sessions"]
    bad_level = tmp_path / "loadtest_bad.json"
    bad_level.write_text(json.dumps(raw))
    with pytest.raises(PlanInputError) as caught:
        load_measurements([tmp_path / "loadtest_bad.json"])
    assert str(caught.value) == (
        f"{bad_level}: not a valid loadtest result: levels[1].sessions: Field required"
    )
    unmarked = tmp_path / "other.json"
    unmarked.write_text('{"levels": []}')
    with pytest.raises(PlanInputError, match=r"other\.json: no `benchmark` field"):
        load_measurements([unmarked])
    with pytest.raises(PlanInputError, match=r"list\.json: not a JSON object"):
        parse_measurement([], str(tmp_path / "list.json"))


def test_other_benchmarks_in_a_directory_are_listed_as_ignored(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(LITE.read_text())
    (tmp_path / "b.json").write_text('{"benchmark": "mystery", "command": "x"}')
    (tmp_path / "notes.txt").write_text("not a measurement")
    found, ignored = load_measurements([tmp_path])
    assert [m.path for m in found] == [str(tmp_path / "a.json")]
    assert ignored == [f"{tmp_path / 'b.json'}: benchmark `mystery` is not used by the planner"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(PlanInputError, match=r"no \.json measurement files"):
        load_measurements([empty])


def test_cli_prints_and_writes_markdown_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, as_json = tmp_path / "plans" / "capacity.md", tmp_path / "plans" / "capacity.json"
    argv = [str(FIXTURES), "--target-sessions", "30", "--users", "1000"]
    argv += ["--concurrency-ratio", "0.05", "--headroom", "0.2"]
    main([*argv, "--out", str(out), "--json", str(as_json)])
    printed = capsys.readouterr().out
    assert out.read_text() == printed
    assert printed.startswith("# Capacity plan")
    assert f"`voice-agent plan {argv[0]} --target-sessions 30" in printed
    plan = Plan.model_validate_json(as_json.read_text())
    assert plan.options.users == 1000 and plan.options.headroom == 0.2
    lite = setup_for(plan, LITE)
    assert lite.sizing[0].machines_with_headroom is not None
    assert lite.sizing[0].machines_with_headroom.value == 6
    assert math.isclose(setup_for(plan, GPU).estimates["engines"].value, 96)


def test_cli_errors_name_the_file_or_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "loadtest_x.json"
    broken.write_text("[]")
    with pytest.raises(SystemExit) as exited:
        main([str(broken)])
    assert exited.value.code == 1
    assert f"voice-agent plan: error: {broken}: not a JSON object" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(LITE), "--concurrency-ratio", "1.5"])
    assert "--concurrency-ratio: Input should be less than or equal to 1" in (
        capsys.readouterr().err
    )


def test_add_plan_command_registers_the_subcommand() -> None:
    parser = argparse.ArgumentParser(prog="voice-agent")
    add_plan_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["plan", str(LITE), "--users", "10", "--headroom", "0.2"])
    assert args.func is run
    assert (args.inputs, args.users, args.headroom) == ([LITE], 10, 0.2)
    default = parser.parse_args(["plan"])
    assert default.inputs == [Path("benchmarks/results")]


def test_one_engine_alone_is_an_upper_bound_said_so() -> None:
    (only,) = plan_of(ASR, turns_per_minute=3).setups
    engines = only.estimates["engines"]
    assert engines.value == 3000  # floor(150 ÷ (3 ÷ 60)), ASR only
    assert engines.formula is not None
    assert "TTS not measured on this machine, so an upper bound" in engines.formula
    assert any(m.startswith("no TTS engine benchmark on this machine") for m in only.missing)


def test_a_stage_without_samples_is_shown_as_not_measured() -> None:
    raw = json.loads(LITE.read_text())
    raw["levels"][2]["stages_ms"]["time_to_silence"] = None
    raw["levels"][2]["stages_ms"]["end_of_turn"] = {"count": 0, "p50": None, "p95": None}
    parsed = parse_measurement(raw, "loadtest_no_barge_ins.json")
    assert parsed is not None
    latency = build_plan([parsed], PlanOptions(target_sessions=10)).setups[0].latency
    assert latency is not None
    stages = {s.stage: s for s in latency.stages}
    assert "time_to_silence" not in stages
    assert stages["end_of_turn"].p50 is None and stages["end_of_turn"].count == 0
    text = render_markdown(build_plan([parsed], PlanOptions(target_sessions=10)))
    assert "| end_of_turn | — | — | — | 0 |" in text
