"""The plan's schema: what `build_plan` returns, the markdown shows and --json writes."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from services.plan.figures import Figure, Out


class PlanOptions(Out):
    model_config = ConfigDict(frozen=True, allow_inf_nan=False)
    """Finite, and bounded where a number past the bound would overflow the arithmetic."""

    target_sessions: int | None = Field(default=None, ge=1)
    users: int | None = Field(default=None, ge=1)
    concurrency_ratio: float | None = Field(default=None, gt=0, le=1)
    turns_per_minute: float | None = Field(default=None, ge=0.001, le=600)
    headroom: float = Field(default=0.0, ge=0, le=10)
    asr_calls_per_turn: float = Field(default=1.0, ge=0.01, le=1000)
    reply_s_per_turn: float | None = Field(default=None, ge=0.01, le=3600)
    hosts_for: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=lambda: [1_000, 10_000, 50_000], min_length=1
    )
    gateway_host_cores: int = Field(default=16, ge=2, le=1024)
    redis_turns_per_s: float | None = Field(default=None, ge=0.001, le=1e9)
    budget_ms: float | None = Field(default=None, gt=0, le=600_000)
    """Voice-to-voice p95 budget to judge every loadtest by (default: each file's own)."""


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
    within_budget: list[bool | None]
    """Per level: within the voice-to-voice budget, over it, or None: too few turns for its
    p95 to say."""
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


class EngineBasis(Out):
    """What one engine host (one ASR and one TTS device) carries, in turns per second."""

    label: str
    gpu: bool
    turns_per_s: Figure
    pace: Figure | None = None
    """Turns per session-minute its sessions took when it carried `turns_per_s` (a measured
    loadtest: sessions convert to turns/s at this pace, any other is a rescale, an
    ESTIMATE); None: an engine throughput, the same at any pace."""


class HostRow(Out):
    """Hosts for one number of concurrent sessions."""

    sessions: Figure
    turns_per_s: Figure | None
    gateway_processes: Figure | None
    gateway_hosts: Figure | None
    engine_hosts: list[Figure | None]
    """One per `MultiHost.engine_bases`, in order (None: no pace to count turns by)."""
    redis_masters: Figure | None
    redis_nodes: Figure | None


class SeedRow(Out):
    seed: str
    claim: str
    theirs: str
    ours: list[Figure | None]
    """Ours under the seed's assumptions: one per engine basis (None: no pace for it)."""
    how: str


class MultiHost(Out):
    pace: Figure | None
    """The pace of the turns/s column and Redis."""
    pace_how: str = "--turns-per-minute"
    """Where `pace` came from."""
    sessions_per_gateway: Figure | None
    gateways_per_host: Figure
    redis_turns_per_s: Figure | None
    engine_bases: list[EngineBasis]
    rows: list[HostRow]
    seeds: list[SeedRow]
    notes: list[str]
    missing: list[str]


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
    measured_turns_per_s: Figure | None = None
    """Turns/s at the capacity level (the whole stack on this machine)."""
    measured_pace: Figure | None = None
    """Turns per session-minute at the capacity level: the pace `measured_turns_per_s` was
    carried at."""
    engine_turns_per_s: Figure | None = None
    """ESTIMATE: turns/s one ASR and one TTS device carry, from the engine benchmarks."""
    missing: list[str]
    notes: list[str]


class InputFile(Out):
    path: str
    benchmark: str
    command: str
    timestamp: str
    machine: str


class StepRow(Out):
    config: str
    batch: int
    step_ms: Figure
    ms_per_session: Figure
    realtime: bool


class DuplexClaim(Out):
    claim: str
    theirs: str
    ours: Figure | None
    how: str


class DuplexPlan(Out):
    device: str
    steps: list[StepRow]
    weights: Figure
    state_per_session: Figure
    sessions_by_memory: list[tuple[int, Figure]]
    claims: list[DuplexClaim]
    missing: list[str]


class Plan(Out):
    command: str
    options: PlanOptions
    inputs: list[InputFile]
    ignored: list[str]
    setups: list[Setup]
    missing: list[str]
    multi_host: MultiHost | None = None
    duplex: DuplexPlan | None = None
    """The full-duplex section, when a duplex_steps file was given."""
