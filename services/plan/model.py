"""The plan's schema: what `build_plan` returns, the markdown shows and --json writes."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from services.plan.figures import Figure, Out


class PlanOptions(Out):
    target_sessions: int | None = Field(default=None, ge=1)
    users: int | None = Field(default=None, ge=1)
    concurrency_ratio: float | None = Field(default=None, gt=0, le=1)
    turns_per_minute: float | None = Field(default=None, gt=0)
    headroom: float = Field(default=0.0, ge=0, le=10)
    asr_calls_per_turn: float = Field(default=1.0, gt=0)
    reply_s_per_turn: float | None = Field(default=None, gt=0)


class StageLatency(Out):
    stage: str
    count: int | None
    p50: Figure | None
    p95: Figure | None
    p99: Figure | None


class Latency(Out):
    sessions: int
    basis: Literal["measured", "interpolated"]
    levels: list[int]
    realtime_ok: list[bool]
    stages: list[StageLatency]


class ReferenceLatency(Out):
    label: str
    stages: list[StageLatency]


class MemoryLine(Out):
    component: str
    levels: list[int]
    fixed: Figure
    per_session: Figure
    at_target: Figure | None


class Sizing(Out):
    basis: str
    peak_sessions: Figure
    peak_turns_per_s: Figure | None
    sessions_per_machine: Figure
    machines: Figure
    machines_with_headroom: Figure | None


class Setup(Out):
    title: str
    machine: str
    gpu: bool
    profile: str
    loadtest: str | None
    measured_sessions: Figure | None
    pace: Figure | None
    estimates: dict[str, Figure]
    memory: list[MemoryLine]
    latency: Latency | None
    references: list[ReferenceLatency]
    sizing: list[Sizing]
    missing: list[str]
    notes: list[str]


class InputFile(Out):
    path: str
    benchmark: str
    command: str
    timestamp: str
    machine: str


class Plan(Out):
    command: str
    options: PlanOptions
    inputs: list[InputFile]
    ignored: list[str]
    setups: list[Setup]
    missing: list[str]
