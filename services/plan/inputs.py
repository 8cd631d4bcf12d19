"""The measurement files: loadtest results and engine benchmarks, read and validated.

Each file records the command that wrote it, the time and the machine; the plan cites
them for every number it takes from the file.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator


class PlanInputError(Exception):
    """A measurement file the planner cannot use; the message names the file and the fault."""


class _In(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class MachineInfo(_In):
    cpu: str = "unknown CPU"
    cores: int | None = None
    gpus: list[str] = Field(default_factory=list)

    def summary(self) -> str:
        """`2 cores Intel Xeon, no GPU` or `16 cores AMD EPYC, 2× NVIDIA H200 143771 MiB`."""
        cores = f"{self.cores} cores " if self.cores else ""
        if not self.gpus:
            return f"{cores}{self.cpu}, no GPU"
        kinds = Counter(" ".join(part.strip() for part in g.split(",")[:2]) for g in self.gpus)
        return f"{cores}{self.cpu}, " + ", ".join(f"{n}× {kind}" for kind, n in kinds.items())


class MeasurementFile(_In):
    """What every measurement records of where it came from."""

    path: str
    command: str
    timestamp: str
    machine: MachineInfo


class StageStats(_In):
    count: int | None = None
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None


class ServiceSample(_In):
    rss_bytes: int | None = None
    gpu_memory_used_bytes: int | None = None


class LevelServer(_In):
    gateway: ServiceSample | None = None
    asr: ServiceSample | None = None
    tts: ServiceSample | None = None


class Level(_In):
    sessions: int = Field(ge=1)
    turns_per_s: float | None = Field(default=None, ge=0)
    stages_ms: dict[str, StageStats] = Field(default_factory=dict)
    turns: int | None = Field(default=None, ge=0)
    turns_completed: int | None = Field(default=None, ge=0)
    lost_turns: int | None = Field(default=None, ge=0)
    """Turns without an answer (older files: turns − turns_completed)."""
    refused_sessions: int = Field(default=0, ge=0)
    grows: str | None = None
    """The stage whose time grew most since the first level."""
    bottleneck: str | None = None
    """Older files' name for `grows` (client stages only)."""
    server: LevelServer | None = None

    def lost(self) -> tuple[int, str | None]:
        """Lost turns, and the field they come from (None: unknown, taken as none)."""
        if self.lost_turns is not None:
            return self.lost_turns, "lost_turns"
        if self.turns is not None and self.turns_completed is not None:
            return max(0, self.turns - self.turns_completed), "turns, turns_completed"
        return 0, None

    @field_validator("stages_ms", mode="before")
    @classmethod
    def _drop_empty_stages(cls, value: Any) -> Any:
        """A stage with no samples (`null`) is a stage not measured."""
        if isinstance(value, dict):
            return {stage: stats for stage, stats in value.items() if stats is not None}
        return value


class BudgetIn(_In):
    ms: float = Field(gt=0)
    rule: str = "given"


class EngineHealth(_In):
    engine: str | None = None
    model: str | None = None
    device: str | None = None


class Target(_In):
    asr: EngineHealth | None = None
    tts: EngineHealth | None = None


class Loadtest(MeasurementFile):
    benchmark: Literal["loadtest"]
    target: Target = Field(default_factory=Target)
    budget: BudgetIn | None = None
    """The voice-to-voice p95 budget the run judged its levels by (older files: none)."""
    levels: list[Level] = Field(min_length=1)


class AsrRow(_In):
    mode: str = "batched"
    concurrency: int
    max_batch: int
    utterances_per_s: float = Field(gt=0)
    latency_p95_ms: float | None = None


class AsrBatching(MeasurementFile):
    benchmark: Literal["asr_batching"]
    model: str = "unknown model"
    device: str = "unknown device"
    results: list[AsrRow] = Field(min_length=1)


class TtsRow(_In):
    concurrency: int
    syntheses: int = Field(ge=1)
    audio_s: float = Field(gt=0)
    audio_s_per_s: float = Field(gt=0)
    ttfa_p95_ms: float | None = None


class TtsStream(MeasurementFile):
    benchmark: Literal["tts_stream"]
    engine: str
    device: str = "unknown device"
    results: list[TtsRow] = Field(min_length=1)


class V2vTurn(_In):
    speech_stopped_ms: float | None = None
    transcript_final_ms: float | None = None
    voice_to_voice_ms: float | None = None


class VoiceToVoice(MeasurementFile):
    benchmark: Literal["voice_to_voice"]
    profile: str = "unknown profile"
    settings: dict[str, Any] = Field(default_factory=dict)
    turns: list[V2vTurn] = Field(min_length=1)


class Trial(_In):
    time_to_silence_ms: float


class BargeIn(MeasurementFile):
    benchmark: Literal["barge_in"]
    profile: str = "unknown profile"
    trials: list[Trial] = Field(min_length=1)


class DuplexLevel(_In):
    config: str
    batch: int = Field(ge=1)
    step_ms_p50: float = Field(ge=0)
    step_ms_p90: float = Field(ge=0)
    realtime: bool


class RealMemory(_In):
    lm_weights_bytes: int = Field(ge=0)
    mimi_weights_bytes: int = Field(ge=0)
    state_bytes_per_session: int = Field(ge=0)


class DuplexSteps(MeasurementFile):
    """benchmarks/duplex_steps.py: step time against batch, Moshi's memory per session."""

    benchmark: Literal["duplex_steps"]
    device: str = "cpu"
    levels: list[DuplexLevel] = Field(min_length=1)
    real_config_memory: RealMemory


Measurement = Loadtest | AsrBatching | TtsStream | VoiceToVoice | BargeIn | DuplexSteps
_MEASUREMENT: TypeAdapter[Measurement] = TypeAdapter(
    Annotated[Measurement, Field(discriminator="benchmark")]
)
# the `benchmark` names the plan reads; a tuple, so an unhashable `benchmark` value is just unknown
KNOWN = tuple(
    get_args(kind.model_fields["benchmark"].annotation)[0] for kind in get_args(Measurement)
)


def parse_measurement(raw: object, path: str) -> Measurement | None:
    """The typed result in `raw` (read from `path`); None for a benchmark the plan does not use."""
    if not isinstance(raw, dict):
        raise PlanInputError(f"{path}: not a JSON object")
    kind = raw.get("benchmark")
    if kind is None:
        raise PlanInputError(
            f"{path}: no `benchmark` field: not a result of voice-agent loadtest or benchmarks/"
        )
    if kind not in KNOWN:
        return None
    try:
        return _MEASUREMENT.validate_python({**raw, "path": path})
    except ValidationError as exc:
        error = exc.errors()[0]
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"][1:])
        message = f"{path}: not a valid {kind} result: {where[1:]}: {error['msg']}"
        raise PlanInputError(message) from None


def _json_files(inputs: Sequence[Path]) -> list[Path]:
    files: list[Path] = []
    for given in inputs:
        if given.is_dir():
            files.extend(sorted(given.glob("*.json")))
        elif given.is_file():
            files.append(given)
        else:
            raise PlanInputError(f"{given}: no such file or directory")
    if not files:
        raise PlanInputError(f"{', '.join(map(str, inputs))}: no .json measurement files")
    return files


def _read_json(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanInputError(f"{file}: cannot read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise PlanInputError(f"{file}: not JSON: {exc.msg} at line {exc.lineno}") from exc


def load_measurements(inputs: Sequence[Path]) -> tuple[list[Measurement], list[str]]:
    """Every measurement in the files and directories (their *.json) given; and what was
    ignored, with why."""
    found: list[Measurement] = []
    ignored: list[str] = []
    for file in _json_files(inputs):
        raw = _read_json(file)
        parsed = parse_measurement(raw, str(file))
        if parsed is None:
            ignored.append(f"{file}: benchmark `{raw['benchmark']}` is not used by the planner")
        else:
            found.append(parsed)
    return found, ignored
