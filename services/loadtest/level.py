"""One concurrency level: what the sessions measured, merged over workers, as a LEVEL report.

The LEVEL layout is the contract with `voice-agent plan` (docs/loadtest.md): keep its names.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Final

from services.loadtest.breakdown import gateway_added_omitted as omitted_why
from services.loadtest.breakdown import growing_stage
from services.loadtest.capacity import LevelFigures, Verdict, verdict
from services.loadtest.stats import (
    STAGES,
    TurnFigures,
    TurnRecord,
    lag_stats,
    stats,
    turn_figures,
)
from services.loadtest.user import SessionRun

STALL_TOLERANCE_MS: Final = 50.0
"""Agent audio may arrive this much later than real time before a session counts as
fallen behind (the gateway sends 200 ms ahead, so this is already past that lead)."""
SLOW_END_OF_TURN_MS: Final = 1000.0
"""A turn whose end took longer than this is listed in its level's `slow_turns`."""
SLOW_TURNS_LISTED: Final = 50
"""At most this many, the slowest first: an overloaded level would list nearly every turn."""
DECOMPOSED: Final = ("end_of_turn", "asr", "response")
"""The client's stages voice-to-voice is the sum of: where the growing stage is looked for
when the services' metrics were not read."""


@dataclass
class LevelPart:
    """What some sessions of one level measured (one worker's share; picklable)."""

    sessions: int = 0
    turns: int = 0  # started inside the measured window
    turns_completed: int = 0
    barge_ins: int = 0
    attempts: int = 0  # every turn started, ramp included, plus failed connections
    refused: int = 0  # sessions that never connected
    spoke_s: float = 0.0  # speech the users sent
    alive_s: float = 0.0  # the sessions' time connected
    samples_ms: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in STAGES})
    accuracy: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    stalled_responses: int = 0
    send_lag_ms: list[float] = field(default_factory=list)
    loop_lag_ms: list[float] = field(default_factory=list)
    slow_turns: list[dict[str, Any]] = field(default_factory=list)
    """Turns whose end took longer than `SLOW_END_OF_TURN_MS`: what was said, and how."""
    window_extra_s: float = 0.0
    """How far past its planned end the measured window ran (a one-session level that went
    on until it had `Window.min_turns`)."""

    def add_session(self, run: SessionRun) -> None:
        """Fold in one finished session."""
        if run.connect_error is not None:
            self.attempts += 1
            self.refused += 1
            self.errors[run.connect_error] += 1
            return
        conversation, turns = run.conversation, run.turns
        self.sessions += 1
        self.window_extra_s = max(self.window_extra_s, run.window_extra_s)
        self.spoke_s += run.spoke_s
        self.alive_s += run.alive_s
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
            if figures.stages.get("end_of_turn", 0.0) > SLOW_END_OF_TURN_MS:
                self.slow_turns.append(slow_turn(turn, figures))
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
        self.refused += other.refused
        self.spoke_s += other.spoke_s
        self.alive_s += other.alive_s
        for stage in STAGES:
            self.samples_ms[stage].extend(other.samples_ms[stage])
        self.accuracy.extend(other.accuracy)
        self.errors.update(other.errors)
        self.violations.extend(other.violations)
        self.stalled_responses += other.stalled_responses
        self.send_lag_ms.extend(other.send_lag_ms)
        self.loop_lag_ms.extend(other.loop_lag_ms)
        self.slow_turns.extend(other.slow_turns)
        self.window_extra_s = max(self.window_extra_s, other.window_extra_s)

    @property
    def error_rate(self) -> float:
        return sum(self.errors.values()) / max(1, self.attempts)


def slow_turn(turn: TurnRecord, figures: TurnFigures) -> dict[str, Any]:
    """One slow turn, as the results file lists it."""
    return {
        "script": turn.script,
        "barge_in": turn.barge_in,
        "heard": figures.heard,
        "utterances": figures.utterances,
        "stages_ms": {stage: round(value, 1) for stage, value in figures.stages.items()},
    }


def level_report(
    part: LevelPart,
    sessions: int,
    duration_s: float,
    engine_ms: float | None,
    server: dict[str, Any],
    breakdown_ms: dict[str, dict[str, Any]] | None = None,
    gateway_added_omitted: str | None = None,
) -> dict[str, Any]:
    """The LEVEL object of the results file; `judge` gives its verdict, `mark_growth` the
    stage that grows. `gateway_added` is left out (null, and why) when `engine_ms` is not
    known or `gateway_added_omitted` says why it would mean nothing
    (breakdown.gateway_added_omitted)."""
    samples = dict(part.samples_ms)
    if engine_ms is None and gateway_added_omitted is None:
        gateway_added_omitted = omitted_why(None, {}, {})
    if engine_ms is not None and gateway_added_omitted is None:
        samples["gateway_added"] = [v - engine_ms for v in samples["gateway_added"]]
    else:
        samples["gateway_added"] = []
    stages: dict[str, Any] = {stage: stats(samples[stage]) for stage in STAGES}
    if gateway_added_omitted is not None:
        stages["gateway_added"] = None
    window_s = duration_s + part.window_extra_s
    accuracy = part.accuracy
    return {
        "sessions": sessions,
        "duration_s": round(window_s, 1),
        "turns": part.turns,
        "turns_completed": part.turns_completed,
        "lost_turns": part.turns - part.turns_completed,
        "refused_sessions": part.refused,
        "barge_ins": part.barge_ins,
        "turns_per_s": round(part.turns / window_s, 3) if window_s > 0 else 0.0,
        "duty_cycle": round(part.spoke_s / part.alive_s, 3) if part.alive_s > 0 else None,
        "stages_ms": stages,
        "breakdown_ms": breakdown_ms or {},
        "errors": dict(sorted(part.errors.items())),
        "error_rate": round(part.error_rate, 4),
        "word_accuracy": {
            "mean": round(sum(accuracy) / len(accuracy), 3) if accuracy else None,
            "count": len(accuracy),
        },
        "within_budget": None,
        "over_budget": None,
        "too_few_turns": None,
        "audio_kept_up": part.stalled_responses == 0,
        "contract_violations": list(part.violations),  # moved to the top level by the run
        "stalled_responses": part.stalled_responses,
        "grows": None,
        "engine_ms": None if engine_ms is None else round(engine_ms, 1),
        "gateway_added_omitted": gateway_added_omitted,
        "server": server,
        "client": {
            "event_loop_lag_ms": lag_stats(part.loop_lag_ms),
            "send_lag_ms": lag_stats(part.send_lag_ms),
        },
        "samples_ms": {stage: [round(v, 1) for v in samples[stage]] for stage in STAGES},
        "slow_turns": sorted(part.slow_turns, key=lambda turn: -turn["stages_ms"]["end_of_turn"])[
            :SLOW_TURNS_LISTED
        ],
    }


def figures_of(level: dict[str, Any]) -> LevelFigures:
    """What the capacity rule looks at in a LEVEL."""
    v2v = level["stages_ms"]["voice_to_voice"]
    return LevelFigures(
        sessions=int(level["sessions"]),
        v2v_p95_ms=v2v["p95"],
        lost_turns=int(level["lost_turns"]),
        refused_sessions=int(level["refused_sessions"]),
        v2v_count=v2v.get("count"),
    )


def judge(
    level: dict[str, Any],
    budget_ms: float | None,
    no_budget: str = "no budget: the one-session level answered no turn",
) -> Verdict:
    """Set the level's `within_budget` (True, False, or None: too few turns for its p95 to
    say), `over_budget` (why not within) and `too_few_turns` (why no verdict); returns the
    verdict. No budget known: over, for `no_budget`."""
    state, why = ("over", no_budget) if budget_ms is None else verdict(figures_of(level), budget_ms)
    level["within_budget"] = None if state == "too_few_turns" else state == "within"
    level["over_budget"] = why if state == "over" else None
    level["too_few_turns"] = why if state == "too_few_turns" else None
    return state


def mark_growth(levels: list[dict[str, Any]]) -> None:
    """Each level's `grows`: the stage whose mean grew most since the first level (from
    the services' metrics), or else the client stage whose p95 grew most."""
    if not levels:
        return
    first = levels[0]
    for level in levels[1:]:
        grown = growing_stage(first["breakdown_ms"], level["breakdown_ms"])
        if grown is None and not level["breakdown_ms"]:
            grown = _client_growth(first["stages_ms"], level["stages_ms"])
        level["grows"] = grown


def _client_growth(first: dict[str, Any], level: dict[str, Any]) -> str | None:
    growth = {
        stage: (level[stage]["p95"] or 0.0) - (first[stage]["p95"] or 0.0)
        for stage in DECOMPOSED
        if level[stage]["p95"] is not None
    }
    if not growth:
        return None
    stage = max(growth, key=lambda s: growth[s])
    return stage if growth[stage] > 0 else None
