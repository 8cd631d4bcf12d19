"""`voice-agent plan`: a capacity plan computed from measurement files, every figure traced.

    voice-agent plan benchmarks/results --target-sessions 30 --users 1000 \\
        --concurrency-ratio 0.05 --headroom 0.2 --out plans/capacity.md --json plans/capacity.json

Reads loadtest results (`voice-agent loadtest`) and the engine benchmarks under
benchmarks/ (asr_batching, tts_stream, voice_to_voice, barge_in). Measured figures are
copied from a file; figures computed beyond what was measured are marked ESTIMATE and
carry their formula; every figure carries the file, command, time, machine and field it
came from. What was not measured is said, with the command that would measure it.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import string
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

OPTIONS_PATH = "(plan options)"
STAGES = ("end_of_turn", "asr", "response", "voice_to_voice", "time_to_silence", "gateway_added")
MIB = 1024 * 1024
WORD = string.ascii_letters + string.digits + "_"
RUN_LOADTEST = (
    "voice-agent loadtest --sessions 1,5,10,20 --duration 60 --asr-url ... --tts-url ... "
    "--out benchmarks/results/loadtest_<machine>.json"
)
RUN_ASR_GPU = (
    "python -m benchmarks.asr_batching --device cuda --random-size large-v3-turbo "
    "--out benchmarks/results/asr_batching_gpu_turbo_random.json"
)
RUN_TTS_GPU = (
    "python -m benchmarks.tts_stream --engine chatterbox --random-weights --tokens 125 "
    "--out benchmarks/results/tts_stream_chatterbox_random_gpu.json"
)


class PlanInputError(Exception):
    """A measurement file the planner cannot use; the message names the file and the fault."""


# ---------------------------------------------------------------- the measurement files


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


class _Result(_In):
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
    realtime_ok: bool

    @field_validator("stages_ms", mode="before")
    @classmethod
    def _drop_empty_stages(cls, value: Any) -> Any:
        """A stage with no samples (`null`) is a stage not measured."""
        if isinstance(value, dict):
            return {stage: stats for stage, stats in value.items() if stats is not None}
        return value

    bottleneck: str | None = None
    server: LevelServer | None = None


class EngineHealth(_In):
    engine: str | None = None
    model: str | None = None
    device: str | None = None


class Target(_In):
    asr: EngineHealth | None = None
    tts: EngineHealth | None = None


class Loadtest(_Result):
    benchmark: Literal["loadtest"]
    target: Target = Field(default_factory=Target)
    levels: list[Level] = Field(min_length=1)


class AsrRow(_In):
    mode: str = "batched"
    concurrency: int
    max_batch: int
    utterances_per_s: float = Field(gt=0)
    latency_p95_ms: float | None = None


class AsrBatching(_Result):
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


class TtsStream(_Result):
    benchmark: Literal["tts_stream"]
    engine: str
    device: str = "unknown device"
    results: list[TtsRow] = Field(min_length=1)


class V2vTurn(_In):
    speech_stopped_ms: float | None = None
    transcript_final_ms: float | None = None
    voice_to_voice_ms: float | None = None


class VoiceToVoice(_Result):
    benchmark: Literal["voice_to_voice"]
    profile: str = "unknown profile"
    settings: dict[str, Any] = Field(default_factory=dict)
    turns: list[V2vTurn] = Field(min_length=1)


class Trial(_In):
    time_to_silence_ms: float


class BargeIn(_Result):
    benchmark: Literal["barge_in"]
    profile: str = "unknown profile"
    trials: list[Trial] = Field(min_length=1)


Measurement = Loadtest | AsrBatching | TtsStream | VoiceToVoice | BargeIn
_MEASUREMENT: TypeAdapter[Measurement] = TypeAdapter(
    Annotated[Measurement, Field(discriminator="benchmark")]
)
KNOWN = ("loadtest", "asr_batching", "tts_stream", "voice_to_voice", "barge_in")


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


def load_measurements(inputs: Sequence[Path]) -> tuple[list[Measurement], list[str]]:
    """Every measurement in the files and directories (their *.json) given; and what was
    ignored, with why."""
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
    found: list[Measurement] = []
    ignored: list[str] = []
    for file in files:
        try:
            raw = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise PlanInputError(f"{file}: cannot read: {exc}") from exc
        except json.JSONDecodeError as exc:
            raise PlanInputError(f"{file}: not JSON: {exc.msg} at line {exc.lineno}") from exc
        parsed = parse_measurement(raw, str(file))
        if parsed is None:
            ignored.append(f"{file}: benchmark `{raw['benchmark']}` is not used by the planner")
        else:
            found.append(parsed)
    return found, ignored


# ---------------------------------------------------------------- the plan


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True)


class Source(_Out):
    path: str
    field: str
    command: str = ""
    timestamp: str = ""
    machine: str = ""


class Figure(_Out):
    """One number of the plan, with where it came from."""

    value: float
    unit: str
    sources: list[Source]
    estimate: bool = False
    formula: str | None = None


class PlanOptions(BaseModel):
    model_config = ConfigDict(frozen=True)

    target_sessions: int | None = Field(default=None, ge=1)
    users: int | None = Field(default=None, ge=1)
    concurrency_ratio: float | None = Field(default=None, gt=0, le=1)
    turns_per_minute: float | None = Field(default=None, gt=0)
    headroom: float = Field(default=0.0, ge=0, le=10)
    asr_calls_per_turn: float = Field(default=1.0, gt=0)
    reply_s_per_turn: float | None = Field(default=None, gt=0)


class StageLatency(_Out):
    stage: str
    count: int | None
    p50: Figure | None
    p95: Figure | None
    p99: Figure | None


class Latency(_Out):
    sessions: int
    basis: Literal["measured", "interpolated"]
    levels: list[int]
    realtime_ok: list[bool]
    stages: list[StageLatency]


class ReferenceLatency(_Out):
    label: str
    stages: list[StageLatency]


class MemoryLine(_Out):
    component: str
    levels: list[int]
    fixed: Figure
    per_session: Figure
    at_target: Figure | None


class Sizing(_Out):
    basis: str
    peak_sessions: Figure
    peak_turns_per_s: Figure | None
    sessions_per_machine: Figure
    machines: Figure
    machines_with_headroom: Figure | None


class Setup(_Out):
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


class InputFile(_Out):
    path: str
    benchmark: str
    command: str
    timestamp: str
    machine: str


class Plan(_Out):
    command: str
    options: PlanOptions
    inputs: list[InputFile]
    ignored: list[str]
    setups: list[Setup]
    missing: list[str]


def _source(m: Measurement, field: str) -> Source:
    return Source(
        path=m.path,
        field=field,
        command=m.command,
        timestamp=m.timestamp,
        machine=m.machine.summary(),
    )


def _measured(value: float, unit: str, m: Measurement, *fields: str) -> Figure:
    return Figure(value=value, unit=unit, sources=[_source(m, f) for f in fields])


def _option(value: float, unit: str, flag: str) -> Figure:
    return Figure(value=value, unit=unit, sources=[Source(path=OPTIONS_PATH, field=flag)])


def _derived(
    value: float, unit: str, formula: str, inputs: Iterable[Figure], estimate: bool | None = None
) -> Figure:
    """A figure computed from others: their sources, and ESTIMATE if any input was one."""
    figures = list(inputs)
    sources: list[Source] = []
    for figure in figures:
        sources.extend(s for s in figure.sources if s not in sources)
    marked = any(f.estimate for f in figures) if estimate is None else estimate
    return Figure(value=value, unit=unit, sources=sources, estimate=marked, formula=formula)


def fmt(value: float) -> str:
    """A number as a plan shows it: integers bare, others to three significant places."""
    if float(value).is_integer():
        return str(int(value))
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}" if abs(value) >= 1 else f"{value:.2g}"


def _ceil(value: float) -> int:
    """Ceiling that ignores float noise: 50 × 1.2 ÷ 10 is 6, not 7."""
    return math.ceil(round(value, 9))


def _floor(value: float) -> int:
    return math.floor(round(value, 9))


# ---------------------------------------------------------------- sessions per machine


def measured_sessions(test: Loadtest) -> tuple[Figure | None, list[str]]:
    """The largest level that stayed real time with every smaller level real time too."""
    notes: list[str] = []
    ordered = sorted(enumerate(test.levels), key=lambda pair: pair[1].sessions)
    best: tuple[int, Level] | None = None
    broke: Level | None = None
    for index, level in ordered:
        if not level.realtime_ok:
            broke = level
            break
        best = (index, level)
    if broke is not None and any(
        lv.realtime_ok and lv.sessions > broke.sessions for lv in test.levels
    ):
        notes.append(
            f"a level above {broke.sessions} sessions stayed real time although "
            f"{broke.sessions} did not: noisy run; measure again before trusting more"
        )
    if broke is None:
        notes.append(
            f"every level stayed real time: capacity is at least {ordered[-1][1].sessions} "
            "sessions; run larger levels to find where it breaks"
        )
    else:
        where = f" (bottleneck: {broke.bottleneck})" if broke.bottleneck else ""
        notes.append(f"broke at {broke.sessions} sessions{where}")
    if best is None:
        notes.append(f"not even {ordered[0][1].sessions} session(s) stayed real time")
        return None, notes
    index, level = best
    figure = _measured(
        level.sessions,
        "sessions",
        test,
        f"levels[{index}].sessions",
        f"levels[{index}].realtime_ok",
    )
    return figure, notes


def loadtest_pace(test: Loadtest, sessions: Figure | None) -> Figure | None:
    """Turns per session-minute the loadtest's sessions took, at the level that held."""
    wanted = sessions.value if sessions is not None else test.levels[0].sessions
    for index, level in enumerate(test.levels):
        if level.sessions == wanted and level.turns_per_s is not None:
            per_min = level.turns_per_s / level.sessions * 60
            inputs = [
                _measured(level.turns_per_s, "turns/s", test, f"levels[{index}].turns_per_s"),
                _measured(level.sessions, "sessions", test, f"levels[{index}].sessions"),
            ]
            formula = (
                f"turns_per_s ÷ sessions × 60 = {fmt(level.turns_per_s)} ÷ {level.sessions} × 60"
            )
            return _derived(per_min, "turns/session-min", formula, inputs, estimate=False)
    return None


def asr_estimate(bench: AsrBatching, pace: Figure, options: PlanOptions) -> Figure:
    """ESTIMATE: sessions one ASR device carries, from its best measured throughput."""
    index, row = max(enumerate(bench.results), key=lambda pair: pair[1].utterances_per_s)
    rate = _measured(
        row.utterances_per_s, "utterances/s", bench, f"results[{index}].utterances_per_s"
    )
    calls = _option(options.asr_calls_per_turn, "calls/turn", "--asr-calls-per-turn")
    sessions = _floor(rate.value / (pace.value / 60 * calls.value))
    p95 = f", latency p95 {fmt(row.latency_p95_ms)} ms" if row.latency_p95_ms is not None else ""
    formula = (
        "floor(utterances/s ÷ (turns per session-minute ÷ 60 × ASR calls per turn)) = "
        f"floor({fmt(rate.value)} ÷ ({fmt(pace.value)} ÷ 60 × {fmt(calls.value)})); "
        f"best row: {row.mode}, concurrency {row.concurrency}, max_batch {row.max_batch}{p95}; "
        f"{bench.model} on {bench.device}. Per ASR device. Whisper pads each utterance to a "
        "30 s window, so the encoder costs the same for any utterance up to 30 s: the cost "
        "is counted per utterance, not per second of speech. Throughput only: latency not "
        "checked"
    )
    return _derived(sessions, "sessions", formula, [rate, pace, calls], estimate=True)


def tts_estimate(bench: TtsStream, pace: Figure, options: PlanOptions) -> Figure:
    """ESTIMATE: sessions one TTS device carries, from its best audio-seconds per second."""
    index, row = max(enumerate(bench.results), key=lambda pair: pair[1].audio_s_per_s)
    rate = _measured(row.audio_s_per_s, "audio s/s", bench, f"results[{index}].audio_s_per_s")
    if options.reply_s_per_turn is not None:
        reply = _option(options.reply_s_per_turn, "s/turn", "--reply-s-per-turn")
    else:
        reply = _derived(
            row.audio_s / row.syntheses,
            "s/turn",
            f"audio_s ÷ syntheses = {fmt(row.audio_s)} ÷ {row.syntheses} (the benchmark's mean "
            "sentence, taken as the reply per turn; set --reply-s-per-turn)",
            [
                _measured(row.audio_s, "s", bench, f"results[{index}].audio_s"),
                _measured(row.syntheses, "syntheses", bench, f"results[{index}].syntheses"),
            ],
            estimate=True,
        )
    sessions = _floor(rate.value / (reply.value * pace.value / 60))
    formula = (
        "floor(audio s/s ÷ (reply s per turn × turns per session-minute ÷ 60)) = "
        f"floor({fmt(rate.value)} ÷ ({fmt(reply.value)} × {fmt(pace.value)} ÷ 60)); "
        f"best row: concurrency {row.concurrency}; {bench.engine} on {bench.device}. "
        "Per TTS device. Throughput only: time to first audio not checked"
    )
    return _derived(sessions, "sessions", formula, [rate, reply, pace], estimate=True)


def _device_kind(device: str | None) -> str | None:
    if device is None:
        return None
    return "cuda" if device.startswith("cuda") else device


def engine_benches(
    test: Loadtest | None, benches: Sequence[Measurement], missing: list[str]
) -> tuple[AsrBatching | None, TtsStream | None, list[str]]:
    """The newest ASR and TTS engine benchmark that measured the engines the loadtest ran."""
    notes: list[str] = []
    asr_health = test.target.asr if test is not None else None
    tts_health = test.target.tts if test is not None else None
    asr = [b for b in benches if isinstance(b, AsrBatching)]
    tts = [b for b in benches if isinstance(b, TtsStream)]
    if test is not None and (asr_health is None or asr_health.engine is None) and asr:
        notes.append(
            "the loadtest did not record its ASR engine (no --asr-url): ASR estimate "
            "assumes the engine asr_batching measured"
        )
    elif asr_health is not None and asr_health.engine is not None:
        kind = _device_kind(asr_health.device)
        asr = [b for b in asr if asr_health.engine == "faster-whisper" and b.device == kind]
    if test is not None and (tts_health is None or tts_health.engine is None) and tts:
        notes.append(
            "the loadtest did not record its TTS engine (no --tts-url): TTS estimate "
            "assumes the engine tts_stream measured"
        )
    elif tts_health is not None and tts_health.engine is not None:
        kind = _device_kind(tts_health.device)
        tts = [b for b in tts if b.engine == tts_health.engine and b.device == kind]
    if not asr:
        missing.append(_no_engine_benchmark("ASR", asr_health))
    if not tts:
        missing.append(_no_engine_benchmark("TTS", tts_health))
    newest_asr = max(asr, key=lambda b: b.timestamp) if asr else None
    newest_tts = max(tts, key=lambda b: b.timestamp) if tts else None
    return newest_asr, newest_tts, notes


def _no_engine_benchmark(name: str, health: EngineHealth | None) -> str:
    engine = health.engine if health is not None and health.engine else None
    device = _device_kind(health.device if health is not None else None) or "cuda"
    if name == "ASR" and engine not in (None, "faster-whisper"):
        return (
            f"no ASR engine benchmark for {engine} (benchmarks/asr_batching.py measures "
            "faster-whisper only): no ASR throughput estimate"
        )
    run = (
        f"python -m benchmarks.asr_batching --device {device} --out ..."
        if name == "ASR"
        else f"python -m benchmarks.tts_stream --engine {engine or 'espeak|chatterbox'} --out ..."
    )
    return (
        f"no {name} engine benchmark{' for ' + engine if engine else ''} on this machine: run {run}"
    )


def estimates(
    asr: AsrBatching | None, tts: TtsStream | None, pace: Figure | None, options: PlanOptions
) -> dict[str, Figure]:
    found: dict[str, Figure] = {}
    if pace is None:
        return found
    if asr is not None:
        found["asr"] = asr_estimate(asr, pace, options)
    if tts is not None:
        found["tts"] = tts_estimate(tts, pace, options)
    if not found:
        return found
    parts = [f"{name.upper()} {fmt(f.value)}" for name, f in found.items()]
    if len(found) == 2:
        formula = (
            f"min({', '.join(parts)}): one ASR and one TTS device, as the dual-gpu layout; "
            "the gateway's CPU is not in this estimate"
        )
    else:
        unmeasured = "TTS" if "asr" in found else "ASR"
        formula = (
            f"{parts[0]} alone: {unmeasured} not measured on this machine, so an upper bound; "
            "the gateway's CPU is not in this estimate"
        )
    smallest = min(found.values(), key=lambda f: f.value)
    found["engines"] = _derived(smallest.value, "sessions", formula, found.values())
    return found


# ---------------------------------------------------------------- memory


MEMORY = (
    ("gateway", "rss_bytes", "gateway RSS"),
    ("asr", "rss_bytes", "ASR RSS"),
    ("asr", "gpu_memory_used_bytes", "ASR GPU memory"),
    ("tts", "rss_bytes", "TTS RSS"),
    ("tts", "gpu_memory_used_bytes", "TTS GPU memory"),
)


def least_squares(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through (x, y) points."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread
    return mean_y - slope * mean_x, slope


def memory_lines(test: Loadtest, options: PlanOptions, missing: list[str]) -> list[MemoryLine]:
    """Fixed and per-session memory of each component, from a line over the levels."""
    lines = []
    for service, key, label in MEMORY:
        found: list[tuple[int, Level, float]] = []
        for index, level in enumerate(test.levels):
            sample = getattr(level.server, service, None) if level.server else None
            value = getattr(sample, key, None) if sample is not None else None
            if value is not None:
                found.append((index, level, float(value)))
        if len({level.sessions for _, level, _ in found}) < 2:
            missing.append(_memory_gap(test, service, key, label, len(found)))
            continue
        lines.append(_memory_line(test, found, label, key, options))
    return lines


def _memory_gap(test: Loadtest, service: str, key: str, label: str, points: int) -> str:
    sampled = any(getattr(lv.server, service, None) for lv in test.levels if lv.server)
    if not sampled and service != "gateway":
        return f"{label}: {service.upper()} not sampled: run the loadtest with --{service}-url"
    if not sampled:
        return f"{label}: the loadtest has no server samples (server.gateway)"
    health = getattr(test.target, service, None)
    if key == "gpu_memory_used_bytes" and points == 0:
        device = health.device if health is not None and health.device else "an unknown device"
        return f"{label}: not reported ({service.upper()} ran on {device})"
    return f"{label}: {points} level(s) reported it; a per-session slope needs two"


def _memory_line(
    test: Loadtest,
    found: list[tuple[int, Level, float]],
    label: str,
    key: str,
    options: PlanOptions,
) -> MemoryLine:
    service = label.split()[0].lower()
    samples = [
        _measured(value, "bytes", test, f"levels[{i}].server.{service}.{key}")
        for i, _, value in found
    ]
    points = [(float(level.sessions), value) for _, level, value in found]
    fixed, slope = least_squares(points)
    listed = ", ".join(f"({fmt(x)}, {fmt(y / MIB)} MiB)" for x, y in points)
    fit = f"least squares over (sessions, {label}) = {listed}"
    per_session = _derived(
        slope, "bytes/session", f"slope: Σ(x−x̄)(y−ȳ) ÷ Σ(x−x̄)²; {fit}", samples, estimate=False
    )
    fixed_part = _derived(
        fixed, "bytes", f"intercept: ȳ − slope × x̄; {fit}", samples, estimate=False
    )
    at_target = None
    if options.target_sessions is not None:
        n = options.target_sessions
        at_target = _derived(
            fixed + slope * n,
            "bytes",
            f"fixed + per session × {n} = {fmt(fixed / MIB)} MiB + {fmt(slope / MIB)} MiB × {n}",
            [fixed_part, per_session, _option(n, "sessions", "--target-sessions")],
            estimate=True,
        )
    return MemoryLine(
        component=label,
        levels=[level.sessions for _, level, _ in found],
        fixed=fixed_part,
        per_session=per_session,
        at_target=at_target,
    )


# ---------------------------------------------------------------- latency


def _stage_figure(test: Loadtest, index: int, stage: str, q: str) -> Figure | None:
    stats = test.levels[index].stages_ms.get(stage)
    value = getattr(stats, q) if stats is not None else None
    if value is None:
        return None
    return _measured(value, "ms", test, f"levels[{index}].stages_ms.{stage}.{q}")


def latency_at(test: Loadtest, target: int, missing: list[str]) -> Latency | None:
    """Per-stage latency at `target` sessions: measured there, or interpolated between the
    levels either side (ESTIMATE); never extrapolated."""
    levels = test.levels
    exact = [i for i, level in enumerate(levels) if level.sessions == target]
    if exact:
        index = exact[-1]
        stages = [
            StageLatency(
                stage=stage,
                count=levels[index].stages_ms[stage].count,
                **{q: _stage_figure(test, index, stage, q) for q in ("p50", "p95", "p99")},
            )
            for stage in STAGES
            if stage in levels[index].stages_ms
        ]
        return Latency(
            sessions=target,
            basis="measured",
            levels=[target],
            realtime_ok=[levels[index].realtime_ok],
            stages=stages,
        )
    below = [i for i, level in enumerate(levels) if level.sessions < target]
    above = [i for i, level in enumerate(levels) if level.sessions > target]
    if not below or not above:
        measured = sorted({level.sessions for level in levels})
        side = "above the largest" if not above else "below the smallest"
        missing.append(
            f"latency at {target} sessions: {target} is {side} measured level "
            f"({', '.join(map(str, measured))}); not extrapolated: run the loadtest with "
            f"--sessions including {target}"
        )
        return None
    lo = max(below, key=lambda i: levels[i].sessions)
    hi = min(above, key=lambda i: levels[i].sessions)
    stages = []
    for stage in STAGES:
        if stage not in levels[lo].stages_ms or stage not in levels[hi].stages_ms:
            continue
        figures = {q: _interpolate(test, lo, hi, stage, q, target) for q in ("p50", "p95", "p99")}
        if any(figures.values()):
            stages.append(StageLatency(stage=stage, count=None, **figures))
    return Latency(
        sessions=target,
        basis="interpolated",
        levels=[levels[lo].sessions, levels[hi].sessions],
        realtime_ok=[levels[lo].realtime_ok, levels[hi].realtime_ok],
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
    return _derived(value, "ms", formula, [a, b], estimate=True)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest rank, as benchmarks/report.py computes it: every value shown was measured."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def _series_stage(m: Measurement, stage: str, field: str, values: list[float]) -> StageLatency:
    def at(q: int) -> Figure:
        how = f"{field}, nearest rank of {len(values)}: p{q}"
        return _measured(round(percentile(values, q), 1), "ms", m, how)

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
    stopped = [t.speech_stopped_ms or 0.0 for t in turns]
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


# ---------------------------------------------------------------- machines needed


def sizing(
    bases: Sequence[tuple[str, Figure]],
    pace: Figure | None,
    options: PlanOptions,
    missing: list[str],
) -> list[Sizing]:
    """Machines for --users at --concurrency-ratio, per basis of sessions per machine."""
    if options.users is None or options.concurrency_ratio is None:
        absent = "--users" if options.users is None else "--concurrency-ratio"
        missing.append(
            f"machines needed: not computed without {absent} "
            "(peak concurrent sessions = users × concurrency ratio)"
        )
        return []
    users = _option(options.users, "users", "--users")
    ratio = _option(options.concurrency_ratio, "fraction", "--concurrency-ratio")
    peak = _derived(
        _ceil(users.value * ratio.value),
        "sessions",
        f"ceil(users × concurrency ratio) = ceil({fmt(users.value)} × {fmt(ratio.value)})",
        [users, ratio],
    )
    rate = None
    if pace is not None:
        rate = _derived(
            peak.value * pace.value / 60,
            "turns/s",
            f"peak sessions × turns per session-minute ÷ 60 = {fmt(peak.value)} × "
            f"{fmt(pace.value)} ÷ 60",
            [peak, pace],
        )
    found = []
    for basis, per_machine in bases:
        if per_machine.value < 1:
            missing.append(f"machines needed ({basis}): under one session per machine")
            continue
        found.append(_size(basis, peak, rate, per_machine, options))
    return found


def _size(
    basis: str, peak: Figure, rate: Figure | None, per_machine: Figure, options: PlanOptions
) -> Sizing:
    machines = _derived(
        _ceil(peak.value / per_machine.value),
        "machines",
        f"ceil(peak sessions ÷ sessions per machine) = ceil({fmt(peak.value)} ÷ "
        f"{fmt(per_machine.value)})",
        [peak, per_machine],
    )
    with_headroom = None
    if options.headroom > 0:
        headroom = _option(options.headroom, "fraction", "--headroom")
        with_headroom = _derived(
            _ceil(peak.value * (1 + headroom.value) / per_machine.value),
            "machines",
            f"ceil(peak sessions × (1 + headroom) ÷ sessions per machine) = "
            f"ceil({fmt(peak.value)} × {fmt(1 + headroom.value)} ÷ {fmt(per_machine.value)})",
            [peak, headroom, per_machine],
        )
    return Sizing(
        basis=basis,
        peak_sessions=peak,
        peak_turns_per_s=rate,
        sessions_per_machine=per_machine,
        machines=machines,
        machines_with_headroom=with_headroom,
    )


def _rescaled(measured: Figure, pace: Figure, options: PlanOptions) -> Figure | None:
    """ESTIMATE: the measured sessions at --turns-per-minute instead of the loadtest's pace."""
    if options.turns_per_minute is None or math.isclose(options.turns_per_minute, pace.value):
        return None
    wanted = _option(options.turns_per_minute, "turns/session-min", "--turns-per-minute")
    value = _floor(measured.value * pace.value / wanted.value)
    formula = (
        "floor(measured sessions × loadtest turns per session-minute ÷ --turns-per-minute) = "
        f"floor({fmt(measured.value)} × {fmt(pace.value)} ÷ {fmt(wanted.value)}); "
        "assumes the per-turn work is what limits"
    )
    return _derived(value, "sessions", formula, [measured, pace, wanted], estimate=True)


# ---------------------------------------------------------------- the whole plan


def _profile(test: Loadtest) -> str:
    parts = []
    for name, health in (("ASR", test.target.asr), ("TTS", test.target.tts)):
        if health is None or health.engine is None:
            parts.append(f"{name} not recorded")
        else:
            model = f" {health.model}" if health.model else ""
            parts.append(f"{name} {health.engine}{model} on {health.device or '?'}")
    return ", ".join(parts)


def _pace(options: PlanOptions, own: Figure | None, fallback: Figure | None) -> Figure | None:
    if options.turns_per_minute is not None:
        return _option(options.turns_per_minute, "turns/session-min", "--turns-per-minute")
    return own or fallback


def _setup(
    test: Loadtest | None,
    machine: MachineInfo,
    others: Sequence[Measurement],
    options: PlanOptions,
    fallback_pace: Figure | None,
) -> Setup:
    missing: list[str] = []
    notes: list[str] = []
    measured: Figure | None = None
    own_pace: Figure | None = None
    memory: list[MemoryLine] = []
    latency: Latency | None = None
    if test is None:
        missing.append(f"no loadtest on this machine: run {RUN_LOADTEST}")
    else:
        measured, found_notes = measured_sessions(test)
        notes.extend(found_notes)
        own_pace = loadtest_pace(test, measured)
        memory = memory_lines(test, options, missing)
        if options.target_sessions is not None:
            latency = latency_at(test, options.target_sessions, missing)
    pace = _pace(options, own_pace, fallback_pace)
    if pace is not None and pace is fallback_pace:
        notes.append(
            f"turns per session-minute taken from {pace.sources[0].path}: the loadtest's "
            "workload, not this machine's; set --turns-per-minute for your users"
        )
    if pace is None:
        missing.append("turns per session-minute: no loadtest pace; give --turns-per-minute")
    asr, tts, bench_notes = engine_benches(test, others, missing)
    notes.extend(bench_notes)
    found = estimates(asr, tts, pace, options)
    bases: list[tuple[str, Figure]] = []
    if measured is not None:
        bases.append(("measured: largest real-time loadtest level", measured))
        rescaled = _rescaled(measured, own_pace, options) if own_pace is not None else None
        if rescaled is not None:
            bases.append(("measured, rescaled to --turns-per-minute", rescaled))
    if "engines" in found:
        bases.append(("engine throughput", found["engines"]))
    if options.target_sessions is None and test is not None:
        missing.append("latency at the target: give --target-sessions")
    references = [reference_latency(m) for m in others if isinstance(m, VoiceToVoice | BargeIn)]
    profile = _profile(test) if test is not None else "engine benchmarks only"
    where = test.path if test is not None else "engine benchmarks"
    return Setup(
        title=f"{machine.summary()} — {where}",
        machine=machine.summary(),
        gpu=bool(machine.gpus),
        profile=profile,
        loadtest=test.path if test is not None else None,
        measured_sessions=measured,
        pace=pace,
        estimates=found,
        memory=memory,
        latency=latency,
        references=references,
        sizing=sizing(bases, pace, options, missing),
        missing=missing,
        notes=notes,
    )


def build_plan(
    measurements: Sequence[Measurement],
    options: PlanOptions,
    ignored: Sequence[str] = (),
    command: str = "voice-agent plan",
) -> Plan:
    """The plan: one setup per loadtest, one per machine measured by engine benchmarks only."""
    by_machine: dict[str, list[Measurement]] = {}
    machines: dict[str, MachineInfo] = {}
    for m in measurements:
        by_machine.setdefault(m.machine.summary(), []).append(m)
        machines.setdefault(m.machine.summary(), m.machine)
    tests = [m for m in measurements if isinstance(m, Loadtest)]
    paces = (loadtest_pace(t, measured_sessions(t)[0]) for t in tests)
    fallback = next((p for p in paces if p is not None), None)
    setups = []
    for key, found in by_machine.items():
        others = [m for m in found if not isinstance(m, Loadtest)]
        own = [m for m in found if isinstance(m, Loadtest)]
        for test in own:
            setups.append(_setup(test, machines[key], others, options, fallback))
        if not own:
            setups.append(_setup(None, machines[key], others, options, fallback))
    missing = []
    if not any(m.machine.gpus for m in measurements):
        missing.append(
            f"no GPU measurement: on the GPU host run {RUN_ASR_GPU}; {RUN_TTS_GPU}; "
            "and a loadtest against the dual-gpu profile"
        )
    if not tests:
        missing.append(f"no loadtest at all: nothing was measured end to end; run {RUN_LOADTEST}")
    inputs = [
        InputFile(
            path=m.path,
            benchmark=m.benchmark,
            command=m.command,
            timestamp=m.timestamp,
            machine=m.machine.summary(),
        )
        for m in measurements
    ]
    return Plan(
        command=command,
        options=options,
        inputs=inputs,
        ignored=list(ignored),
        setups=setups,
        missing=missing,
    )


# ---------------------------------------------------------------- markdown


class Citations:
    """Footnotes: one number per file and the fields cited together from it."""

    def __init__(self) -> None:
        self.numbers: dict[tuple[str, tuple[str, ...]], int] = {}
        self.sources: dict[str, Source] = {}

    def __call__(self, *figures: Figure | None) -> str:
        fields: dict[str, list[str]] = {}
        for figure in figures:
            for source in figure.sources if figure is not None else []:
                listed = fields.setdefault(source.path, [])
                if source.field not in listed:
                    listed.append(source.field)
                self.sources.setdefault(source.path, source)
        marks = []
        for path, listed in fields.items():
            number = self.numbers.setdefault((path, tuple(listed)), len(self.numbers) + 1)
            marks.append(f"[{number}]")
        return "".join(marks)

    def lines(self) -> list[str]:
        found = []
        for (path, fields), number in self.numbers.items():
            s = self.sources[path]
            if path == OPTIONS_PATH:
                found.append(f"- [{number}] plan options — {', '.join(fields)}")
            else:
                found.append(
                    f"- [{number}] {path} — `{s.command}` — {s.timestamp} — {s.machine} — "
                    + "; ".join(_compress(fields))
                )
        return found


def _compress(fields: Sequence[str]) -> list[str]:
    """`a.p50`, `a.p95`, `a.p99` as `a.{p50,p95,p99}`: fields grouped by all but their last word."""
    groups: dict[str, list[str]] = {}
    for field in fields:
        head = field.rstrip(WORD)
        groups.setdefault(head, []).append(field[len(head) :])
    return [
        head + (tails[0] if len(tails) == 1 else "{" + ",".join(tails) + "}")
        for head, tails in groups.items()
    ]


def _cell(text: str, marks: str) -> str:
    return f"{text} {marks}" if marks else text


def _value(figure: Figure | None, unit: str = "") -> str:
    if figure is None:
        return "—"
    text = f"{fmt(figure.value)}{unit}"
    return f"{text} (ESTIMATE)" if figure.estimate else text


def _bytes(figure: Figure | None) -> str:
    if figure is None:
        return "—"
    size = figure.value / MIB
    text = f"{fmt(size / 1024)} GiB" if abs(size) >= 1024 else f"{fmt(size)} MiB"
    return f"{text} (ESTIMATE)" if figure.estimate else text


def render_markdown(plan: Plan) -> str:
    """The plan as a markdown document, every figure footnoted to its file and field."""
    cite = Citations()
    o = plan.options
    pace = fmt(o.turns_per_minute) if o.turns_per_minute else "from the loadtest"
    out = [
        "# Capacity plan",
        "",
        f"Generated by `{plan.command}` from {len(plan.inputs)} measurement file(s). "
        "Measured figures are copied from a file; **ESTIMATE** marks a figure computed "
        "beyond what was measured, with its formula. Footnotes name the file, its command, "
        "its time, its machine and the field. Each setup below holds for its own machine "
        "and profile only.",
        "",
        f"Options: target sessions {o.target_sessions or '—'} · users {o.users or '—'} · "
        f"concurrency ratio {fmt(o.concurrency_ratio) if o.concurrency_ratio else '—'} · "
        f"turns per session-minute {pace} · "
        f"headroom {fmt(o.headroom * 100)}%",
        "",
        "## Summary",
        "",
        "| # | machine | profile | sessions per machine (measured) "
        "| sessions (ESTIMATE, engines) | machines needed |",
        "|---|---|---|---|---|---|",
    ]
    for number, setup in enumerate(plan.setups, 1):
        size = setup.sizing[0] if setup.sizing else None
        needed = "—"
        if size is not None:
            needed = f"{_value(size.machines)} ({size.basis})"
            if size.machines_with_headroom is not None:
                needed += f"; {_value(size.machines_with_headroom)} with headroom"
            needed += f" {cite(size.machines, size.machines_with_headroom)}"
        engines = setup.estimates.get("engines")
        out.append(
            f"| {number} | {setup.machine} | {setup.profile} | "
            f"{_cell(_value(setup.measured_sessions), cite(setup.measured_sessions))} | "
            f"{_cell(_value(engines), cite(engines))} | {needed} |"
        )
    for number, setup in enumerate(plan.setups, 1):
        out += ["", *_setup_markdown(number, setup, o, cite)]
    if plan.missing:
        out += ["", "## Not measured yet", "", *(f"- {m}" for m in plan.missing)]
    out += ["", "## Inputs", "", "| file | benchmark | command | timestamp | machine |"]
    out.append("|---|---|---|---|---|")
    out += [
        f"| {i.path} | {i.benchmark} | `{i.command}` | {i.timestamp} | {i.machine} |"
        for i in plan.inputs
    ]
    if plan.ignored:
        out += ["", "Ignored:", "", *(f"- {line}" for line in plan.ignored)]
    out += ["", "## Sources", "", *cite.lines()]
    return "\n".join(out) + "\n"


def _setup_markdown(number: int, setup: Setup, o: PlanOptions, cite: Citations) -> list[str]:
    out = [
        f"## {number}. {setup.title}",
        "",
        f"For this machine and profile only — machine: {setup.machine}; profile: {setup.profile}.",
        "",
        "### Sessions per machine",
        "",
        "| basis | sessions | how |",
        "|---|---|---|",
    ]
    if setup.measured_sessions is not None:
        out.append(
            f"| measured: largest level that stayed real time (`realtime_ok`) | "
            f"{_value(setup.measured_sessions)} {cite(setup.measured_sessions)} | "
            "every level up to it was real time |"
        )
    if setup.measured_sessions is None and not setup.estimates:
        out.append("| — | — | neither a loadtest nor an engine estimate: see Missing |")
    names = {"asr": "ASR throughput", "tts": "TTS throughput", "engines": "engines (the smaller)"}
    for key, figure in setup.estimates.items():
        out.append(f"| {names[key]} | {_value(figure)} {cite(figure)} | {figure.formula} |")
    if setup.pace is not None:
        how = setup.pace.formula or "--turns-per-minute"
        out += ["", f"Turns per session-minute: {_value(setup.pace)} ({how}) {cite(setup.pace)}"]
    if setup.notes:
        out += ["", *(f"- {note}" for note in setup.notes)]
    out += _memory_markdown(setup, o, cite)
    out += _latency_markdown(setup, cite)
    for reference in setup.references:
        out += [
            "",
            f"### One session: {reference.label}",
            "",
            *_stage_table(reference.stages, cite),
        ]
    out += _sizing_markdown(setup, o, cite)
    if setup.missing:
        out += ["", "### Missing", "", *(f"- {line}" for line in setup.missing)]
    return out


def _memory_markdown(setup: Setup, o: PlanOptions, cite: Citations) -> list[str]:
    if not setup.memory:
        return []
    target = f"at {o.target_sessions} sessions" if o.target_sessions else "at target"
    out = [
        "",
        "### Memory per session",
        "",
        "Least-squares line over the loadtest levels: memory = fixed + per session × sessions.",
        "",
        f"| component | fixed | per session | {target} | levels | source |",
        "|---|---|---|---|---|---|",
    ]
    for line in setup.memory:
        out.append(
            f"| {line.component} | {_bytes(line.fixed)} | {_bytes(line.per_session)} | "
            f"{_bytes(line.at_target)} | {', '.join(map(str, line.levels))} | "
            f"{cite(line.fixed, line.per_session, line.at_target)} |"
        )
    return out


def _latency_markdown(setup: Setup, cite: Citations) -> list[str]:
    latency = setup.latency
    if latency is None:
        return []
    ok = ", ".join(
        f"level {n}: realtime_ok {str(v).lower()}"
        for n, v in zip(latency.levels, latency.realtime_ok, strict=True)
    )
    if latency.basis == "measured":
        how = f"Measured at that level ({ok})."
    else:
        how = (
            f"ESTIMATE: interpolated linearly between the levels either side ({ok}): "
            "v(lo) + (v(hi) − v(lo)) × (N − lo) ÷ (hi − lo)."
        )
    return [
        "",
        f"### Latency at {latency.sessions} sessions",
        "",
        how,
        "",
        *_stage_table(latency.stages, cite),
    ]


def _stage_table(stages: Sequence[StageLatency], cite: Citations) -> list[str]:
    out = ["| stage | p50 ms | p95 ms | p99 ms | n | source |", "|---|---|---|---|---|---|"]
    for s in stages:
        count = "—" if s.count is None else str(s.count)
        out.append(
            f"| {s.stage} | {_value(s.p50)} | {_value(s.p95)} | {_value(s.p99)} | {count} | "
            f"{cite(s.p50, s.p95, s.p99)} |"
        )
    return out


def _sizing_markdown(setup: Setup, o: PlanOptions, cite: Citations) -> list[str]:
    if not setup.sizing:
        return []
    first = setup.sizing[0]
    out = [
        "",
        f"### Machines for {o.users} users",
        "",
        f"- peak concurrent sessions = {first.peak_sessions.formula} = "
        f"**{_value(first.peak_sessions)}** {cite(first.peak_sessions)}",
    ]
    if first.peak_turns_per_s is not None:
        rate = first.peak_turns_per_s
        out.append(
            f"- peak turn rate = {rate.formula} = **{_value(rate, ' turns/s')}** {cite(rate)}"
        )
    for size in setup.sizing:
        line = (
            f"- {size.basis}: {size.machines.formula} = **{_value(size.machines)}** "
            f"{cite(size.machines)}"
        )
        if size.machines_with_headroom is not None:
            extra = size.machines_with_headroom
            line += (
                f"; with {fmt(o.headroom * 100)}% headroom: {extra.formula} = "
                f"**{_value(extra)}** {cite(extra)}"
            )
        out.append(line)
    return out


# ---------------------------------------------------------------- command line


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "inputs",
        nargs="*",
        type=Path,
        default=[Path("benchmarks/results")],
        help="measurement files or directories of *.json (default: benchmarks/results)",
    )
    parser.add_argument("--target-sessions", type=int, help="concurrency to report latency at")
    parser.add_argument("--users", type=int, help="users to size for")
    parser.add_argument(
        "--concurrency-ratio", type=float, help="fraction of the users in a conversation at peak"
    )
    parser.add_argument(
        "--turns-per-minute",
        type=float,
        help="turns per session-minute (default: the pace the loadtest measured)",
    )
    parser.add_argument(
        "--headroom", type=float, default=0.0, help="spare capacity, e.g. 0.2 for 20%%"
    )
    parser.add_argument(
        "--asr-calls-per-turn",
        type=float,
        default=1.0,
        help="ASR model calls per turn for the ASR estimate (1: the final; partials add more)",
    )
    parser.add_argument(
        "--reply-s-per-turn",
        type=float,
        help="seconds of agent speech per turn for the TTS estimate (default: the benchmark's)",
    )
    parser.add_argument("--out", type=Path, help="write the markdown plan here too")
    parser.add_argument("--json", type=Path, help="write the plan as JSON here")


def _options(args: argparse.Namespace) -> PlanOptions:
    fields = PlanOptions.model_fields
    try:
        return PlanOptions(**{name: getattr(args, name) for name in fields})
    except ValidationError as exc:
        error = exc.errors()[0]
        flag = "--" + str(error["loc"][0]).replace("_", "-")
        raise PlanInputError(f"{flag}: {error['msg']}") from exc


def run(args: argparse.Namespace) -> None:
    """The `plan` subcommand: print the plan; write it to --out and --json when given."""
    argv = getattr(args, "argv", None)
    command = shlex.join(["voice-agent", "plan", *(argv if argv is not None else sys.argv[2:])])
    try:
        options = _options(args)
        measurements, ignored = load_measurements(args.inputs)
    except PlanInputError as exc:
        print(f"voice-agent plan: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from exc
    plan = build_plan(measurements, options, ignored, command)
    text = render_markdown(plan)
    print(text, end="", flush=True)
    for path, body in ((args.out, text), (args.json, plan.model_dump_json(indent=2) + "\n")):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(body, encoding="utf-8")
            print(f"wrote {path}", file=sys.stderr, flush=True)


def add_plan_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `plan` on the CLI's subcommands."""
    plan = sub.add_parser("plan", help="a capacity plan from measurement files")
    _add_arguments(plan)
    plan.set_defaults(func=run)


def main(argv: list[str] | None = None) -> None:
    """`python -m services.common.planner ARGS`: the same as `voice-agent plan ARGS`."""
    parser = argparse.ArgumentParser(prog="voice-agent plan", description=__doc__.split("\n")[0])
    _add_arguments(parser)
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    run(args)


if __name__ == "__main__":
    main()
