"""Latency per stage: at the target concurrency from a loadtest, and for one session from
the voice_to_voice and barge_in benchmarks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from services.common.stats import percentile
from services.loadtest import stats
from services.plan.figures import Figure, derived, fmt, measured
from services.plan.inputs import BargeIn, Loadtest, MeasurementFile, VoiceToVoice
from services.plan.model import Latency, PlanOptions, ReferenceLatency, StageLatency
from services.plan.sessions import judge_loadtest

QUANTILES = ("p50", "p95", "p99")
STAGES: Final = tuple(stage for stage in stats.STAGES if stage != "gateway_added")
"""The loadtest's stages the plan publishes as latencies. Not `gateway_added`: a time less a
mean, negative wherever the engines worked before the turn ended (speculative transcripts,
prepared replies), and dependent on which services the run watched."""


def latency_at(
    test: Loadtest, target: int, missing: list[str], options: PlanOptions | None = None
) -> Latency | None:
    """Per-stage latency at `target` sessions: measured there, or interpolated between the
    levels either side (ESTIMATE); never extrapolated."""
    levels = test.levels
    within = _within(judge_loadtest(test, options or PlanOptions()).verdicts)
    exact = [i for i, level in enumerate(levels) if level.sessions == target]
    if exact:
        return _measured_at(test, exact[-1], within)
    below = [i for i, level in enumerate(levels) if level.sessions < target]
    above = [i for i, level in enumerate(levels) if level.sessions > target]
    if not below or not above:
        measured_levels = sorted({level.sessions for level in levels})
        side = "above the largest" if not above else "below the smallest"
        missing.append(
            f"latency at {target} sessions: {target} is {side} measured level "
            f"({', '.join(map(str, measured_levels))}); not extrapolated: run the loadtest with "
            f"--sessions including {target}"
        )
        return None
    lo = max(below, key=lambda i: levels[i].sessions)
    hi = min(above, key=lambda i: levels[i].sessions)
    return _interpolated_at(test, lo, hi, target, within)


def _within(verdicts: Sequence[str]) -> list[bool | None]:
    """Per level: within the budget, over it, or None: too few turns to say."""
    return [None if v == "too_few_turns" else v == "within" for v in verdicts]


def _stage_figure(test: Loadtest, index: int, stage: str, q: str) -> Figure | None:
    stats = test.levels[index].stages_ms.get(stage)
    value = getattr(stats, q) if stats is not None else None
    if value is None:
        return None
    return measured(value, "ms", test, f"levels[{index}].stages_ms.{stage}.{q}")


def _measured_at(test: Loadtest, index: int, within: list[bool | None]) -> Latency:
    level = test.levels[index]
    stages = [
        StageLatency(
            stage=stage,
            count=level.stages_ms[stage].count,
            **{q: _stage_figure(test, index, stage, q) for q in QUANTILES},
        )
        for stage in STAGES
        if stage in level.stages_ms
    ]
    return Latency(
        sessions=level.sessions,
        basis="measured",
        levels=[level.sessions],
        within_budget=[within[index]],
        stages=stages,
    )


def _interpolated_at(
    test: Loadtest, lo: int, hi: int, target: int, within: list[bool | None]
) -> Latency:
    low, high = test.levels[lo], test.levels[hi]
    stages = []
    for stage in STAGES:
        if stage not in low.stages_ms or stage not in high.stages_ms:
            continue
        figures = {q: _interpolate(test, lo, hi, stage, q, target) for q in QUANTILES}
        if any(figures.values()):
            stages.append(StageLatency(stage=stage, count=None, **figures))
    return Latency(
        sessions=target,
        basis="interpolated",
        levels=[low.sessions, high.sessions],
        within_budget=[within[lo], within[hi]],
        stages=stages,
    )


def _interpolate(
    test: Loadtest, lo: int, hi: int, stage: str, q: str, target: int
) -> Figure | None:
    a, b = _stage_figure(test, lo, stage, q), _stage_figure(test, hi, stage, q)
    if a is None or b is None:
        return None
    x0, x1 = test.levels[lo].sessions, test.levels[hi].sessions
    value = a.value + (b.value - a.value) * (target - x0) / (x1 - x0)
    formula = (
        f"linear between levels: v({x0}) + (v({x1}) − v({x0})) × ({target} − {x0}) ÷ "
        f"({x1} − {x0}) = {fmt(a.value)} + ({fmt(b.value)} − {fmt(a.value)}) × "
        f"{target - x0} ÷ {x1 - x0}"
    )
    return derived(value, "ms", formula, [a, b], estimate=True)


def _series_stage(m: MeasurementFile, stage: str, field: str, values: list[float]) -> StageLatency:
    def at(q: int) -> Figure:
        how = f"{field}, nearest rank of {len(values)}: p{q}"
        return measured(round(percentile(values, q), 1), "ms", m, how)

    return StageLatency(stage=stage, count=len(values), p50=at(50), p95=at(95), p99=at(99))


def reference_latency(m: VoiceToVoice | BargeIn) -> ReferenceLatency:
    """One-session latencies per stage from a voice_to_voice or barge_in benchmark."""
    if isinstance(m, BargeIn):
        values = [t.time_to_silence_ms for t in m.trials]
        stage = _series_stage(m, "time_to_silence", "trials[*].time_to_silence_ms", values)
        return ReferenceLatency(label=f"{m.path} — {m.profile}", stages=[stage])
    turns = [
        t
        for t in m.turns
        if None not in (t.speech_stopped_ms, t.transcript_final_ms, t.voice_to_voice_ms)
    ]
    stopped = [t.speech_stopped_ms or 0.0 for t in turns]  # `or 0.0`: never None here
    final = [t.transcript_final_ms or 0.0 for t in turns]
    v2v = [t.voice_to_voice_ms or 0.0 for t in turns]
    series = (
        ("end_of_turn", "turns[*].speech_stopped_ms", stopped),
        ("asr", "turns[*].transcript_final_ms − speech_stopped_ms", _minus(final, stopped)),
        ("response", "turns[*].voice_to_voice_ms − transcript_final_ms", _minus(v2v, final)),
        ("voice_to_voice", "turns[*].voice_to_voice_ms", v2v),
    )
    stages = [_series_stage(m, stage, field, values) for stage, field, values in series if values]
    settings = ", ".join(f"{k} {v}" for k, v in m.settings.items())
    return ReferenceLatency(label=f"{m.path} — {m.profile}; {settings}", stages=stages)


def _minus(a: list[float], b: list[float]) -> list[float]:
    return [x - y for x, y in zip(a, b, strict=True)]
