"""`voice-agent plan`'s multi-host view against hand-computed cases.

Fixtures (tests/fixtures/plan/): a fake-engine loadtest (the gateway alone: 25, 50, 100
sessions, all within the voice-to-voice budget, 10 turns/s at 100), a dual-GPU loadtest
(40 sessions held at 2.0 turns/s), and that GPU machine's engine benchmarks (best ASR 150
utterances/s; best TTS 24 audio s/s with 40 s over 8 syntheses: 5 s per reply, so 4.8
turns/s).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from services.plan.build import build_plan
from services.plan.cli import main
from services.plan.figures import OPTIONS_PATH
from services.plan.hosts import RUN_FAKE
from services.plan.inputs import load_measurements
from services.plan.model import MultiHost, PlanOptions
from services.plan.render import render_markdown

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "plan"
FAKE = FIXTURES / "loadtest_fake.json"
GPU = FIXTURES / "loadtest_dual_gpu.json"
ASR = FIXTURES / "asr_batching_gpu.json"
TTS = FIXTURES / "tts_stream_gpu.json"
OPTIONS: dict[str, Any] = {
    "turns_per_minute": 6,
    "hosts_for": [1000],
    "gateway_host_cores": 9,
    "redis_turns_per_s": 50,
}


def view(*paths: Path, **options: Any) -> MultiHost:
    plan = build_plan(load_measurements(list(paths))[0], PlanOptions(**options))
    assert plan.multi_host is not None
    return plan.multi_host


def test_gateway_hosts_from_the_fake_engine_loadtest() -> None:
    hosts = view(FAKE, GPU, ASR, TTS, **OPTIONS)
    assert hosts.sessions_per_gateway is not None and hosts.sessions_per_gateway.value == 100
    assert hosts.sessions_per_gateway.sources[0].path == str(FAKE)
    assert hosts.gateways_per_host.value == 8  # 9 cores, one spare
    (row,) = hosts.rows
    assert row.turns_per_s is not None and row.turns_per_s.value == 100  # 1000 × 6 ÷ 60
    assert row.gateway_processes is not None and row.gateway_processes.value == 10
    assert row.gateway_hosts is not None and row.gateway_hosts.value == 2  # ceil(10 ÷ 8)
    assert any("pins the gateway to one core" in note for note in hosts.notes)


def test_engine_hosts_measured_and_estimated_in_turns_per_second() -> None:
    hosts = view(FAKE, GPU, ASR, TTS, **OPTIONS)
    measured, estimated = hosts.engine_bases  # the fake loadtest is no engine basis
    assert measured.gpu and "measured loadtest" in measured.label
    assert measured.turns_per_s.value == 2.0 and not measured.turns_per_s.estimate
    assert measured.pace is not None and measured.pace.value == 3  # 2.0 ÷ 40 × 60
    assert estimated.turns_per_s.value == pytest.approx(4.8)  # min(150 ÷ 1, 24 ÷ 5)
    assert estimated.turns_per_s.estimate and estimated.pace is None
    (row,) = hosts.rows
    hosts_of = [f.value if f is not None else None for f in row.engine_hosts]
    assert hosts_of == [50, 21]  # ceil(1000 × 6 ÷ 60 ÷ 2), ceil(100 ÷ 4.8)
    # both ESTIMATEs: the GPU host carried its 2 turns/s at 3 turns per session-minute, and
    # --turns-per-minute 6 counts it at another pace; the engine benchmarks are estimates
    assert all(f is not None and f.estimate for f in row.engine_hosts)
    assert row.engine_hosts[0] is not None and row.engine_hosts[0].formula is not None
    assert "carried at 3 turns per session-minute, counted here at 6" in (
        row.engine_hosts[0].formula
    )
    assert hosts.missing == []  # a GPU host was measured


def test_a_measured_host_is_counted_at_its_own_pace_and_not_marked() -> None:
    """Without --turns-per-minute each measured basis converts sessions to turns at the pace
    its own loadtest ran at: 1000 sessions on 40-session hosts are 25 hosts, measured."""
    hosts = view(FAKE, GPU, ASR, TTS, **{**OPTIONS, "turns_per_minute": None})
    (row,) = hosts.rows
    measured, estimated = row.engine_hosts
    assert measured is not None and measured.value == 25 and not measured.estimate
    assert estimated is not None and estimated.estimate


@pytest.mark.parametrize(("redis", "masters", "nodes"), [(200, 1, 3), (50, 2, 6), (10, 10, 20)])
def test_redis_masters_and_nodes(redis: float, masters: int, nodes: int) -> None:
    (row,) = view(FAKE, GPU, **{**OPTIONS, "redis_turns_per_s": redis}).rows
    assert row.redis_masters is not None and row.redis_masters.value == masters
    assert row.redis_nodes is not None and row.redis_nodes.value == nodes


def test_redis_without_a_measurement_is_an_upper_bound_said_so() -> None:
    options = {**OPTIONS, "redis_turns_per_s": None}
    hosts = view(FAKE, GPU, **options)
    assert hosts.redis_turns_per_s is not None and hosts.redis_turns_per_s.value == 10
    assert hosts.rows[0].redis_masters is not None and hosts.rows[0].redis_masters.value == 10
    assert any("UPPER bound" in note for note in hosts.notes)
    plan = build_plan(load_measurements([FAKE, GPU])[0], PlanOptions(**options))
    assert "Redis masters (upper bound)" in render_markdown(plan)


def test_the_seeds_beside_ours_under_their_own_assumptions() -> None:
    seeds = view(FAKE, GPU, ASR, TTS, **OPTIONS).seeds
    first = seeds[0]
    assert first.theirs == "3 GPUs" and "200 req/min" in first.claim
    # 200 req/min = 3.33 turns/s: ceil(3.33 ÷ 2.0) × 2 GPUs and ceil(3.33 ÷ 4.8) × 2 GPUs
    assert [f.value if f else None for f in first.ours] == [4, 2]
    assert first.ours[0] is not None and first.ours[0].sources[0].path.startswith("seed 003")
    # the seed's 0.2 turns per session-minute is not the 3 the GPU host was measured at
    assert first.ours[0].estimate
    per_host = next(s for s in seeds if s.theirs == "100 sessions per host")
    assert [f.value if f else None for f in per_host.ours] == [20, 48]  # 2 × 60 ÷ 6, 4.8 × 60 ÷ 6
    per_gpu = next(s for s in seeds if s.theirs == "5 sessions per GPU")
    assert [f.value if f else None for f in per_gpu.ours] == [10, 24]


def test_without_a_fake_loadtest_the_gateway_figure_is_missing() -> None:
    hosts = view(GPU, ASR, TTS, **OPTIONS)
    assert hosts.sessions_per_gateway is None
    assert hosts.rows[0].gateway_hosts is None
    assert any(RUN_FAKE in line for line in hosts.missing)


def test_cpu_only_engine_hosts_are_not_gpu_hosts() -> None:
    lite = FIXTURES / "loadtest_lite.json"
    hosts = view(FAKE, lite, **OPTIONS)
    assert [b.gpu for b in hosts.engine_bases] == [False]
    assert any("no GPU measurement" in line for line in hosts.missing)


def test_peak_sessions_from_users_join_the_scales() -> None:
    options = {**OPTIONS, "hosts_for": [10, 1000], "users": 1000, "concurrency_ratio": 0.05}
    hosts = view(FAKE, GPU, **options)
    assert [row.sessions.value for row in hosts.rows] == [10, 50, 1000]


def test_every_multi_host_figure_has_a_source() -> None:
    plan = build_plan(load_measurements([FAKE, GPU, ASR, TTS])[0], PlanOptions(**OPTIONS))
    data = json.loads(plan.model_dump_json())["multi_host"]
    files = {str(p) for p in (FAKE, GPU, ASR, TTS)}
    figures = list(_figures(data))
    assert len(figures) > 20
    for figure in figures:
        assert figure["sources"], figure
        for source in figure["sources"]:
            path = source["path"]
            assert path in files or path == OPTIONS_PATH or path.startswith("seed "), path
        assert not figure["estimate"] or figure["formula"], figure


def _figures(node: Any) -> Any:
    if isinstance(node, dict):
        if "sources" in node and "value" in node:
            yield node
        for value in node.values():
            yield from _figures(value)
    elif isinstance(node, list):
        for value in node:
            yield from _figures(value)


def test_cli_options_and_markdown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.md"
    files = [str(FAKE), str(GPU), str(ASR), str(TTS)]
    main(
        [
            *files,
            "--hosts-for",
            "1000,10000",
            "--gateway-host-cores",
            "9",
            "--turns-per-minute",
            "6",
            "--out",
            str(out),
        ]
    )
    text = out.read_text()
    assert "## Many hosts" in text and "### The seeds' estimates beside ours" in text
    assert "| 10000 |" in text and "engine hosts (A)" in text
    assert "## Many hosts" in capsys.readouterr().out


def test_cli_rejects_a_bad_scale_list() -> None:
    with pytest.raises(SystemExit):
        main([str(FAKE), "--hosts-for", "ten"])
