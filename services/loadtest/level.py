"""One concurrency level: what the sessions measured, merged over workers, as a LEVEL report.

The LEVEL layout is the contract with `voice-agent plan` (docs/loadtest.md): keep its names.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Final

from services.loadtest.stats import STAGES, lag_stats, stats, turn_figures
from services.loadtest.user import SessionRun

STALL_TOLERANCE_MS: Final = 50.0
"""Agent audio may arrive this much later than real time before a session counts as
fallen behind (the gateway sends 200 ms ahead, so this is already past that lead)."""
DECOMPOSED: Final = ("end_of_turn", "asr", "response")
"""The stages voice-to-voice is the sum of: where a bottleneck is looked for."""


@dataclass
class LevelPart:
    """What some sessions of one level measured (one worker's share; picklable)."""

    sessions: int = 0
    turns: int = 0  # started inside the measured window
    turns_completed: int = 0
    barge_ins: int = 0
    attempts: int = 0  # every turn started, ramp included, plus failed connections
    samples_ms: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in STAGES})
    accuracy: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    stalled_responses: int = 0
    send_lag_ms: list[float] = field(default_factory=list)
    loop_lag_ms: list[float] = field(default_factory=list)

    def add_session(self, run: SessionRun) -> None:
        """Fold in one finished session."""
        if run.connect_error is not None:
            self.attempts += 1
            self.errors[run.connect_error] += 1
            return
        conversation, turns = run.conversation, run.turns
        self.sessions += 1
        self.attempts += len(turns)
        for turn, figures in zip(turns, turn_figures(conversation, turns), strict=True):
            if not turn.in_window:
                continue
            self.turns += 1
            self.turns_completed += figures.completed
            self.barge_ins += turn.barge_in
            for stage, value in figures.stages.items():
                self.samples_ms[stage].append(value)
            if figures.accuracy is not None:
                self.accuracy.append(figures.accuracy)
        self.errors.update(code for _, code in conversation.errors)
        if run.timeouts:
            self.errors["timeout"] += run.timeouts
        if conversation.closed_by_server:
            self.errors[f"closed_{conversation.close_code}"] += 1
        self.violations.extend(conversation.violations)
        self.stalled_responses += sum(
            1 for r in conversation.responses.values() if r.stall_ms > STALL_TOLERANCE_MS
        )
        self.send_lag_ms.extend(run.send_lag_ms)

    def merge(self, other: LevelPart) -> None:
        self.sessions += other.sessions
        self.turns += other.turns
        self.turns_completed += other.turns_completed
        self.barge_ins += other.barge_ins
        self.attempts += other.attempts
        for stage in STAGES:
            self.samples_ms[stage].extend(other.samples_ms[stage])
        self.accuracy.extend(other.accuracy)
        self.errors.update(other.errors)
        self.violations.extend(other.violations)
        self.stalled_responses += other.stalled_responses
        self.send_lag_ms.extend(other.send_lag_ms)
        self.loop_lag_ms.extend(other.loop_lag_ms)

    @property
    def error_rate(self) -> float:
        return sum(self.errors.values()) / max(1, self.attempts)


def level_report(
    part: LevelPart,
    sessions: int,
    duration_s: float,
    slo_ms: float,
    engine_ms: float | None,
    server: dict[str, Any],
) -> dict[str, Any]:
    """The LEVEL object of the results file (bottleneck filled in by `mark_bottlenecks`)."""
    samples = dict(part.samples_ms)
    if engine_ms is not None:
        samples["gateway_added"] = [v - engine_ms for v in samples["gateway_added"]]
    else:
        samples["gateway_added"] = []  # nothing to subtract: it would only repeat asr+response
    stages = {stage: stats(samples[stage]) for stage in STAGES}
    v2v_p95 = stages["voice_to_voice"]["p95"]
    realtime_ok = v2v_p95 is not None and v2v_p95 <= slo_ms and part.stalled_responses == 0
    accuracy = part.accuracy
    return {
        "sessions": sessions,
        "duration_s": round(duration_s, 1),
        "turns": part.turns,
        "turns_completed": part.turns_completed,
        "barge_ins": part.barge_ins,
        "turns_per_s": round(part.turns / duration_s, 3) if duration_s > 0 else 0.0,
        "stages_ms": stages,
        "errors": dict(sorted(part.errors.items())),
        "error_rate": round(part.error_rate, 4),
        "word_accuracy": {
            "mean": round(sum(accuracy) / len(accuracy), 3) if accuracy else None,
            "count": len(accuracy),
        },
        "realtime_ok": realtime_ok,
        "contract_violations": list(part.violations),  # moved to the top level by the run
        "stalled_responses": part.stalled_responses,
        "bottleneck": None,
        "engine_ms": None if engine_ms is None else round(engine_ms, 1),
        "server": server,
        "client": {
            "event_loop_lag_ms": lag_stats(part.loop_lag_ms),
            "send_lag_ms": lag_stats(part.send_lag_ms),
        },
        "samples_ms": {stage: [round(v, 1) for v in samples[stage]] for stage in STAGES},
    }


def mark_bottlenecks(levels: list[dict[str, Any]]) -> tuple[int | None, str | None]:
    """Fill each failing level's `bottleneck`; return (breaks_at, bottleneck) of the run.

    A level's bottleneck is the stage of voice-to-voice whose p95 grew most since the
    first level; the first level and levels that meet the SLO have none.
    """
    if not levels:
        return None, None
    first = levels[0]["stages_ms"]
    for level in levels[1:]:
        if level["realtime_ok"]:
            continue
        growth = {
            stage: (level["stages_ms"][stage]["p95"] or 0.0) - (first[stage]["p95"] or 0.0)
            for stage in DECOMPOSED
            if level["stages_ms"][stage]["p95"] is not None
        }
        if growth:
            level["bottleneck"] = max(growth, key=lambda stage: growth[stage])
    broken = next((level for level in levels if not level["realtime_ok"]), None)
    if broken is None:
        return None, None
    return int(broken["sessions"]), broken["bottleneck"]
