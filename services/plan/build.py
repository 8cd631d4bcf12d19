"""`build_plan`: the measurements grouped by machine, and the arithmetic put together.

Pure: no files, no printing. One setup per loadtest, one per machine measured by
engine benchmarks only; each holds for its own machine and profile.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.plan.duplex import duplex_plan
from services.plan.engines import engine_benches, estimates
from services.plan.figures import Figure, given
from services.plan.hosts import engine_capacity, held_turn_rate, is_fake, multi_host
from services.plan.inputs import (
    BargeIn,
    DuplexSteps,
    Loadtest,
    MachineInfo,
    Measurement,
    VoiceToVoice,
)
from services.plan.latency import latency_at, reference_latency
from services.plan.memory import memory_lines
from services.plan.model import InputFile, Latency, MemoryLine, Plan, PlanOptions, Setup
from services.plan.sessions import loadtest_pace, measured_sessions, rescaled
from services.plan.sizing import sizing

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


def build_plan(
    measurements: Sequence[Measurement],
    options: PlanOptions,
    ignored: Sequence[str] = (),
    command: str = "voice-agent plan",
) -> Plan:
    """The plan: one setup per loadtest, one per machine measured by engine benchmarks only."""
    duplex = [m for m in measurements if isinstance(m, DuplexSteps)]
    by_machine: dict[str, list[Measurement]] = {}
    for m in measurements:
        if not isinstance(m, DuplexSteps):  # their own section: another kind of session
            by_machine.setdefault(m.machine.summary(), []).append(m)
    tests = [m for m in measurements if isinstance(m, Loadtest)]
    fallback = reference_pace(tests, options)
    setups = []
    for found in by_machine.values():
        others = [m for m in found if not isinstance(m, Loadtest)]
        own: list[Loadtest | None] = [m for m in found if isinstance(m, Loadtest)]
        for test in own or [None]:
            setups.append(_setup(test, found[0].machine, others, options, fallback))
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
    pace = (
        given(options.turns_per_minute, "turns/session-min", "--turns-per-minute")
        if options.turns_per_minute is not None
        else fallback
    )
    return Plan(
        command=command,
        options=options,
        inputs=inputs,
        ignored=list(ignored),
        setups=setups,
        missing=missing,
        multi_host=multi_host(setups, tests, pace, options),
        duplex=duplex_plan(duplex),
    )


def _setup(
    test: Loadtest | None,
    machine: MachineInfo,
    others: Sequence[Measurement],
    options: PlanOptions,
    fallback_pace: Figure | None,
) -> Setup:
    missing: list[str] = []
    notes: list[str] = []
    held: Figure | None = None
    own_pace: Figure | None = None
    memory: list[MemoryLine] = []
    latency: Latency | None = None
    if test is None:
        missing.append(f"no loadtest on this machine: run {RUN_LOADTEST}")
    else:
        held, notes = measured_sessions(test, options)
        own_pace = loadtest_pace(test, held)
        memory = memory_lines(test, options, missing)
        if options.target_sessions is not None:
            latency = latency_at(test, options.target_sessions, missing, options)
    pace = _pace(options, own_pace, fallback_pace, notes, missing)
    asr, tts, bench_notes = engine_benches(test, others, missing)
    notes.extend(bench_notes)
    found = estimates(asr, tts, pace, options)
    bases = _bases(held, own_pace, found, options)
    if options.target_sessions is None and test is not None:
        missing.append("latency at the target: give --target-sessions")
    references = [reference_latency(m) for m in others if isinstance(m, VoiceToVoice | BargeIn)]
    measured_rate = held_turn_rate(test, held) if test is not None and not is_fake(test) else None
    return Setup(
        title=f"{machine.summary()} — {test.path if test is not None else 'engine benchmarks'}",
        machine=machine.summary(),
        gpu=bool(machine.gpus),
        profile=_profile(test) if test is not None else "engine benchmarks only",
        loadtest=test.path if test is not None else None,
        measured_sessions=held,
        pace=pace,
        estimates=found,
        memory=memory,
        latency=latency,
        references=references,
        sizing=sizing(bases, pace, options, missing),
        missing=missing,
        notes=notes,
        measured_turns_per_s=measured_rate,
        measured_pace=own_pace if measured_rate is not None else None,
        engine_turns_per_s=engine_capacity(asr, tts, options),
    )


def reference_pace(tests: Sequence[Loadtest], options: PlanOptions) -> Figure | None:
    """The pace a machine without a loadtest of its own, and the many-hosts view's turns/s,
    are counted at: the busiest any loadtest measured (the most turns per session-minute,
    the safe side; ties by path), whatever order the files were given in."""
    paces = [loadtest_pace(t, measured_sessions(t, options)[0]) for t in tests]
    found = [(p.value, p.sources[0].path, p) for p in paces if p is not None]
    return max(found, key=lambda entry: (entry[0], entry[1]))[2] if found else None


def _pace(
    options: PlanOptions,
    own: Figure | None,
    fallback: Figure | None,
    notes: list[str],
    missing: list[str],
) -> Figure | None:
    """Turns per session-minute: as given, as this loadtest took them, or as another did."""
    if options.turns_per_minute is not None:
        return given(options.turns_per_minute, "turns/session-min", "--turns-per-minute")
    if own is not None:
        return own
    if fallback is not None:
        notes.append(
            f"turns per session-minute taken from {fallback.sources[0].path} (the busiest "
            "loadtest pace): the loadtest's workload, not this machine's; set "
            "--turns-per-minute for your users"
        )
    else:
        missing.append("turns per session-minute: no loadtest pace; give --turns-per-minute")
    return fallback


def _bases(
    held: Figure | None, own_pace: Figure | None, found: dict[str, Figure], options: PlanOptions
) -> list[tuple[str, Figure]]:
    """The sessions per machine to size by, each with what it rests on."""
    bases: list[tuple[str, Figure]] = []
    if held is not None:
        bases.append(("measured: most sessions within the voice-to-voice budget", held))
        scaled = rescaled(held, own_pace, options) if own_pace is not None else None
        if scaled is not None:
            bases.append(("measured, rescaled to --turns-per-minute", scaled))
    if "engines" in found:
        bases.append(("engine throughput", found["engines"]))
    return bases


def _profile(test: Loadtest) -> str:
    parts = []
    for name, health in (("ASR", test.target.asr), ("TTS", test.target.tts)):
        if health is None or health.engine is None:
            parts.append(f"{name} not recorded")
        else:
            model = f" {health.model}" if health.model else ""
            parts.append(f"{name} {health.engine}{model} on {health.device or '?'}")
    return ", ".join(parts)
