"""The multi-host view: gateway hosts, engine (GPU) hosts and Redis nodes for N sessions.

Three capacities, each from a measured file:
- sessions per gateway process: a loadtest with the fake engines (the gateway alone);
- turns/s per engine host (one ASR and one TTS device): a loadtest of a real profile, or
  ESTIMATE from the engine benchmarks;
- turns/s per Redis master: what one Redis carried in a loadtest, a lower bound (no
  loadtest saturated it) unless --redis-turns-per-s gives a measured figure.
Counting in turns per second rather than sessions lets one capacity serve any pace; a
measured one was carried at its own loadtest's pace, so sessions convert to its turns at
that pace, and at any other only as an ESTIMATE (a rescale: the per-turn work limits).
Nothing here depends on the order the files were given in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from services.plan.figures import (
    Figure,
    Source,
    ceil_clean,
    derived,
    floor_clean,
    fmt,
    given,
    measured,
)
from services.plan.inputs import AsrBatching, Loadtest, TtsStream
from services.plan.model import EngineBasis, HostRow, MultiHost, PlanOptions, SeedRow, Setup
from services.plan.seeds import SEED_CLAIMS, SeedClaim
from services.plan.sessions import judge_loadtest, measured_sessions

RUN_FAKE = (
    "python -m benchmarks.loadtest_stack --profile fake --gateway-cpu 0 --others-cpu 1 -- "
    "--sessions 25,50,100,200 --out benchmarks/results/loadtest_fake.json"
)
GPUS_PER_ENGINE_HOST = 2  # the dual-gpu layout: one ASR device and one TTS device


def is_fake(test: Loadtest) -> bool:
    """A loadtest of the fake engines: it measured the gateway (and Redis) alone."""
    engines = (test.target.asr, test.target.tts)
    return all(e is not None and e.engine == "fake" for e in engines)


def held_turn_rate(test: Loadtest, held: Figure | None) -> Figure | None:
    """Turns/s the loadtest carried at its capacity level."""
    if held is None:
        return None
    for index, level in enumerate(test.levels):
        if level.sessions == held.value and level.turns_per_s:
            return measured(level.turns_per_s, "turns/s", test, f"levels[{index}].turns_per_s")
    return None


def engine_capacity(
    asr: AsrBatching | None, tts: TtsStream | None, options: PlanOptions
) -> Figure | None:
    """ESTIMATE: turns/s one ASR and one TTS device carry (the smaller of the two)."""
    if asr is None or tts is None:
        return None
    a_index, a_row = max(enumerate(asr.results), key=lambda p: p[1].utterances_per_s)
    t_index, t_row = max(enumerate(tts.results), key=lambda p: p[1].audio_s_per_s)
    utt = measured(a_row.utterances_per_s, "utt/s", asr, f"results[{a_index}].utterances_per_s")
    audio = measured(t_row.audio_s_per_s, "audio s/s", tts, f"results[{t_index}].audio_s_per_s")
    calls = given(options.asr_calls_per_turn, "calls/turn", "--asr-calls-per-turn")
    if options.reply_s_per_turn is not None:
        reply = given(options.reply_s_per_turn, "s/turn", "--reply-s-per-turn")
    else:
        reply = derived(
            t_row.audio_s / t_row.syntheses,
            "s/turn",
            f"audio_s ÷ syntheses = {fmt(t_row.audio_s)} ÷ {t_row.syntheses}",
            [
                measured(t_row.audio_s, "s", tts, f"results[{t_index}].audio_s"),
                measured(t_row.syntheses, "n", tts, f"results[{t_index}].syntheses"),
            ],
            estimate=True,
        )
    asr_rate = utt.value / calls.value
    tts_rate = audio.value / reply.value
    formula = (
        f"min(ASR utterances/s ÷ calls per turn, TTS audio s/s ÷ reply s per turn) = "
        f"min({fmt(utt.value)} ÷ {fmt(calls.value)}, {fmt(audio.value)} ÷ {fmt(reply.value)})"
        f" = min({fmt(asr_rate)}, {fmt(tts_rate)}); {asr.model} on {asr.device}, "
        f"{tts.engine} on {tts.device}; throughput only"
    )
    return derived(min(asr_rate, tts_rate), "turns/s", formula, [utt, calls, audio, reply], True)


def _gateway(
    tests: Sequence[Loadtest], options: PlanOptions, notes: list[str], missing: list[str]
) -> Figure | None:
    fakes = [t for t in tests if is_fake(t)]
    if not fakes:
        missing.append(f"sessions per gateway process: no fake-engine loadtest; run {RUN_FAKE}")
        return None
    test = max(fakes, key=lambda t: t.timestamp)
    held, found = measured_sessions(test, options)
    notes.extend(f"gateway ({test.path}): {note}" for note in found)
    pinned = "--gateway-cpu" in test.command
    notes.append(
        f"sessions per gateway process from {test.path} (fake engines: the gateway and Redis "
        "alone)"
        + ("; its command pins the gateway to one core" if pinned else "; cores not pinned")
    )
    return held


def _redis(tests: Sequence[Loadtest], options: PlanOptions, notes: list[str]) -> Figure | None:
    if options.redis_turns_per_s is not None:
        return given(options.redis_turns_per_s, "turns/s", "--redis-turns-per-s")
    best: Figure | None = None
    for test in sorted(tests, key=lambda t: t.path):  # ties: the same file whatever the order
        within = judge_loadtest(test, options).within
        for index, level in enumerate(test.levels):
            if (
                within[index]
                and level.turns_per_s
                and (best is None or level.turns_per_s > best.value)
            ):
                best = measured(level.turns_per_s, "turns/s", test, f"levels[{index}].turns_per_s")
    if best is not None:
        notes.append(
            f"Redis: one Redis carried {fmt(best.value)} turns/s without being the bottleneck; "
            "no run saturated it, so Redis masters below are an UPPER bound (a lower bound on "
            "what one master carries); measure the bus at saturation and pass "
            "--redis-turns-per-s"
        )
    return best


def multi_host(
    setups: Sequence[Setup], tests: Sequence[Loadtest], pace: Figure | None, options: PlanOptions
) -> MultiHost:
    """Hosts for each of --hosts-for concurrent sessions, and the seeds' figures beside."""
    notes: list[str] = []
    missing: list[str] = []
    per_gateway = _gateway(tests, options, notes, missing)
    cores = given(options.gateway_host_cores, "cores", "--gateway-host-cores")
    per_host = derived(
        cores.value - 1,
        "processes",
        f"cores − 1 = {fmt(cores.value)} − 1 (one gateway process per core; one core for "
        "nginx and the OS)",
        [cores],
    )
    redis = _redis(tests, options, notes)
    bases = _engine_bases(setups)
    given_pace = options.turns_per_minute is not None
    if not any(b.gpu for b in bases):
        missing.append(
            "engine hosts on GPUs: no GPU measurement; the engine hosts in this view are the "
            "CPU machines measured, not GPU hosts (run the GPU benchmarks named under Not "
            "measured yet)"
        )
    if pace is None:
        missing.append("turns per second: no pace; give --turns-per-minute")
    scales = sorted(set(options.hosts_for) | _peak(options))
    rows = [_row(n, pace, given_pace, per_gateway, per_host, bases, redis) for n in scales]
    seeds = [_seed_row(c, pace, given_pace, bases) for c in SEED_CLAIMS]
    return MultiHost(
        pace=pace,
        pace_how=(
            "--turns-per-minute"
            if given_pace
            else "the busiest pace any loadtest measured, the safe side"
        ),
        sessions_per_gateway=per_gateway,
        gateways_per_host=per_host,
        redis_turns_per_s=redis,
        engine_bases=bases,
        rows=rows,
        seeds=seeds,
        notes=notes,
        missing=missing,
    )


def _peak(options: PlanOptions) -> set[int]:
    if options.users is None or options.concurrency_ratio is None:
        return set()
    return {ceil_clean(options.users * options.concurrency_ratio)}


def _engine_bases(setups: Sequence[Setup]) -> list[EngineBasis]:
    """Every engine basis, in an order of their own (GPU hosts first, measured before
    estimated, then by label and file), not the order the files were given in."""
    bases = []
    for setup in setups:
        if setup.measured_turns_per_s is not None:
            label = f"{setup.machine}, {setup.profile} (measured loadtest, whole stack)"
            bases.append(
                EngineBasis(
                    label=label,
                    gpu=setup.gpu,
                    turns_per_s=setup.measured_turns_per_s,
                    pace=setup.measured_pace,
                )
            )
        if setup.engine_turns_per_s is not None:
            label = f"{setup.machine} (ESTIMATE from engine benchmarks)"
            bases.append(
                EngineBasis(label=label, gpu=setup.gpu, turns_per_s=setup.engine_turns_per_s)
            )
    return sorted(
        bases,
        key=lambda b: (not b.gpu, b.pace is None, b.label, b.turns_per_s.sources[0].path),
    )


def _basis_pace(basis: EngineBasis, view: Figure | None, given_pace: bool) -> Figure | None:
    """The pace to count a basis's sessions at: its own (a measured loadtest's), unless
    --turns-per-minute sets one for all; an engine throughput takes the view's."""
    if basis.pace is not None and not given_pace:
        return basis.pace
    return view


def _rescale_note(basis: EngineBasis, pace: Figure) -> str | None:
    """What a conversion at `pace` assumes when the basis was carried at another pace."""
    if basis.pace is None or math.isclose(basis.pace.value, pace.value):
        return None
    return (
        f"; ESTIMATE: its turns/s was carried at {fmt(basis.pace.value)} turns per "
        f"session-minute, counted here at {fmt(pace.value)}: assumes the per-turn work is "
        "what limits"
    )


def _engine_hosts(sessions: Figure, basis: EngineBasis, pace: Figure | None) -> Figure | None:
    """Engine hosts for `sessions` at `pace`: ceil(turns/s ÷ per host turns/s)."""
    if pace is None:
        return None
    rate = sessions.value * pace.value / 60
    rescale = _rescale_note(basis, pace)
    formula = (
        "ceil(sessions × turns per session-minute ÷ 60 ÷ per host turns/s) = "
        f"ceil({fmt(sessions.value)} × {fmt(pace.value)} ÷ 60 ÷ {fmt(basis.turns_per_s.value)})"
        f" = ceil({fmt(rate)} ÷ {fmt(basis.turns_per_s.value)})" + (rescale or "")
    )
    return derived(
        ceil_clean(rate / basis.turns_per_s.value),
        "hosts",
        formula,
        [sessions, pace, basis.turns_per_s],
        estimate=True if rescale else None,
    )


def _turn_rate(sessions: Figure, pace: Figure) -> Figure:
    return derived(
        sessions.value * pace.value / 60,
        "turns/s",
        f"sessions × turns per session-minute ÷ 60 = {fmt(sessions.value)} × "
        f"{fmt(pace.value)} ÷ 60",
        [sessions, pace],
    )


def _ceil_div(numerator: Figure, denominator: Figure, unit: str, what: str) -> Figure:
    return derived(
        ceil_clean(numerator.value / denominator.value),
        unit,
        f"ceil({what}) = ceil({fmt(numerator.value)} ÷ {fmt(denominator.value)})",
        [numerator, denominator],
    )


def _row(
    n: int,
    pace: Figure | None,
    given_pace: bool,
    per_gateway: Figure | None,
    per_host: Figure,
    bases: Sequence[EngineBasis],
    redis: Figure | None,
) -> HostRow:
    sessions = given(n, "sessions", "--hosts-for")
    rate = _turn_rate(sessions, pace) if pace is not None else None
    processes = hosts = masters = nodes = None
    if per_gateway is not None:
        processes = _ceil_div(sessions, per_gateway, "processes", "sessions ÷ per process")
        hosts = _ceil_div(processes, per_host, "hosts", "processes ÷ per host")
    engines = [_engine_hosts(sessions, b, _basis_pace(b, pace, given_pace)) for b in bases]
    if rate is not None and redis is not None:
        masters = _ceil_div(rate, redis, "masters", "turns/s ÷ per master")
        nodes = _redis_nodes(masters)
    return HostRow(
        sessions=sessions,
        turns_per_s=rate,
        gateway_processes=processes,
        gateway_hosts=hosts,
        engine_hosts=engines,
        redis_masters=masters,
        redis_nodes=nodes,
    )


def _redis_nodes(masters: Figure) -> Figure:
    if masters.value <= 1:
        formula = "1 master + 2 replicas under Sentinel (3 sentinels beside them)"
        return derived(3, "nodes", formula, [masters])
    formula = (
        f"Redis Cluster, one replica per master: max(masters, 3) × 2 = "
        f"max({fmt(masters.value)}, 3) × 2"
    )
    return derived(max(masters.value, 3) * 2, "nodes", formula, [masters])


def _seed_row(
    claim: SeedClaim,
    pace: Figure | None,
    given_pace: bool,
    bases: Sequence[EngineBasis],
) -> SeedRow:
    if claim.kind == "gpus_for_load" and claim.requests_per_min is not None:
        seed = Figure(
            value=claim.requests_per_min,
            unit="req/min",
            sources=[
                Source(path=f"seed {claim.seed}", field=claim.where, command="(seed document)")
            ],
        )
        rate = derived(seed.value / 60, "turns/s", "the seed's req/min ÷ 60", [seed])
        seed_pace = None
        if claim.sessions:
            per_min = claim.requests_per_min / claim.sessions
            how_paced = f"the seed's req/min ÷ its users = {fmt(seed.value)} ÷ {claim.sessions}"
            seed_pace = derived(per_min, "turns/session-min", how_paced, [seed])
        ours: list[Figure | None] = []
        for b in bases:
            rescale = _rescale_note(b, seed_pace) if seed_pace is not None else None
            ours.append(
                derived(
                    ceil_clean(rate.value / b.turns_per_s.value) * GPUS_PER_ENGINE_HOST,
                    "GPUs",
                    f"ceil(turns/s ÷ per engine host) × {GPUS_PER_ENGINE_HOST} = "
                    f"ceil({fmt(rate.value)} ÷ {fmt(b.turns_per_s.value)}) × "
                    f"{GPUS_PER_ENGINE_HOST} ({b.label})" + (rescale or ""),
                    [rate, b.turns_per_s],
                    estimate=True if rescale else None,
                )
            )
        how = (
            f"ours at the seed's own load ({fmt(rate.value)} turns/s), one ASR and one TTS "
            "device per engine host"
        )
        return SeedRow(
            seed=claim.seed,
            claim=claim.claim,
            theirs=f"{fmt(claim.value)} GPUs",
            ours=ours,
            how=how,
        )
    ours = []
    divisor = GPUS_PER_ENGINE_HOST if claim.kind == "sessions_per_gpu" else 1
    for b in bases:
        at = _basis_pace(b, pace, given_pace)
        if at is None:
            ours.append(None)
            continue
        rescale = _rescale_note(b, at)
        ours.append(
            derived(
                floor_clean(b.turns_per_s.value * 60 / at.value / divisor),
                "sessions",
                f"floor(per host turns/s × 60 ÷ turns per session-minute"
                f"{' ÷ 2 GPUs' if divisor == 2 else ''}) = floor({fmt(b.turns_per_s.value)} × "
                f"60 ÷ {fmt(at.value)}{' ÷ 2' if divisor == 2 else ''}) ({b.label})"
                + (rescale or ""),
                [b.turns_per_s, at],
                estimate=True if rescale else None,
            )
        )
    unit = "sessions per GPU" if claim.kind == "sessions_per_gpu" else "sessions per host"
    return SeedRow(
        seed=claim.seed,
        claim=claim.claim,
        theirs=f"{fmt(claim.value)} {unit}",
        ours=ours,
        how=f"ours: {unit} at each host's own pace (or --turns-per-minute)",
    )
