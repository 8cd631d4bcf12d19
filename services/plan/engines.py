"""ESTIMATE: sessions one ASR and one TTS device carry, from the engine benchmarks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, TypeVar

from services.plan.figures import Figure, derived, floor_clean, fmt, given, measured
from services.plan.inputs import AsrBatching, EngineHealth, Loadtest, Measurement, TtsStream
from services.plan.model import PlanOptions

Bench = TypeVar("Bench", AsrBatching, TtsStream)


def asr_estimate(bench: AsrBatching, pace: Figure, options: PlanOptions) -> Figure:
    """ESTIMATE: sessions one ASR device carries, from its best measured throughput."""
    index, row = max(enumerate(bench.results), key=lambda pair: pair[1].utterances_per_s)
    rate = measured(
        row.utterances_per_s, "utterances/s", bench, f"results[{index}].utterances_per_s"
    )
    calls = given(options.asr_calls_per_turn, "calls/turn", "--asr-calls-per-turn")
    sessions = floor_clean(rate.value / (pace.value / 60 * calls.value))
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
    return derived(sessions, "sessions", formula, [rate, pace, calls], estimate=True)


def tts_estimate(bench: TtsStream, pace: Figure, options: PlanOptions) -> Figure:
    """ESTIMATE: sessions one TTS device carries, from its best audio-seconds per second."""
    index, row = max(enumerate(bench.results), key=lambda pair: pair[1].audio_s_per_s)
    rate = measured(row.audio_s_per_s, "audio s/s", bench, f"results[{index}].audio_s_per_s")
    if options.reply_s_per_turn is not None:
        reply = given(options.reply_s_per_turn, "s/turn", "--reply-s-per-turn")
    else:
        reply = derived(
            row.audio_s / row.syntheses,
            "s/turn",
            f"audio_s ÷ syntheses = {fmt(row.audio_s)} ÷ {row.syntheses} (the benchmark's mean "
            "sentence, taken as the reply per turn; set --reply-s-per-turn)",
            [
                measured(row.audio_s, "s", bench, f"results[{index}].audio_s"),
                measured(row.syntheses, "syntheses", bench, f"results[{index}].syntheses"),
            ],
            estimate=True,
        )
    sessions = floor_clean(rate.value / (reply.value * pace.value / 60))
    formula = (
        "floor(audio s/s ÷ (reply s per turn × turns per session-minute ÷ 60)) = "
        f"floor({fmt(rate.value)} ÷ ({fmt(reply.value)} × {fmt(pace.value)} ÷ 60)); "
        f"best row: concurrency {row.concurrency}; {bench.engine} on {bench.device}. "
        "Per TTS device. Throughput only: time to first audio not checked"
    )
    return derived(sessions, "sessions", formula, [rate, reply, pace], estimate=True)


def _device_kind(device: str | None) -> str | None:
    if device is None:
        return None
    return "cuda" if device.startswith("cuda") else device


def _newest_matching(
    benches: list[Bench],
    engine_of: Callable[[Bench], str],
    test: Loadtest | None,
    service: Literal["asr", "tts"],
    notes: list[str],
    missing: list[str],
) -> Bench | None:
    """The newest benchmark of the engine, on the device, the loadtest ran for `service`."""
    health: EngineHealth | None = getattr(test.target, service) if test is not None else None
    name = service.upper()
    if health is not None and health.engine is not None:
        kind = _device_kind(health.device)
        benches = [b for b in benches if engine_of(b) == health.engine and b.device == kind]
    elif test is not None and benches:
        benchmark = "asr_batching" if service == "asr" else "tts_stream"
        notes.append(
            f"the loadtest did not record its {name} engine (no --{service}-url): {name} "
            f"estimate assumes the engine {benchmark} measured"
        )
    if not benches:
        missing.append(_no_engine_benchmark(name, health))
        return None
    return max(benches, key=lambda b: b.timestamp)


def engine_benches(
    test: Loadtest | None, benches: Sequence[Measurement], missing: list[str]
) -> tuple[AsrBatching | None, TtsStream | None, list[str]]:
    """The newest ASR and TTS engine benchmark that measured the engines the loadtest ran."""
    notes: list[str] = []
    asr = _newest_matching(
        [b for b in benches if isinstance(b, AsrBatching)],
        lambda _: "faster-whisper",  # the only engine benchmarks/asr_batching.py measures
        test,
        "asr",
        notes,
        missing,
    )
    tts = _newest_matching(
        [b for b in benches if isinstance(b, TtsStream)],
        lambda b: b.engine,
        test,
        "tts",
        notes,
        missing,
    )
    return asr, tts, notes


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
    """The ASR and TTS estimates there are benchmarks for, and `engines`: the smaller."""
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
        how = f"min({', '.join(parts)}): one ASR and one TTS device, as the dual-gpu layout"
    else:
        unmeasured = "TTS" if "asr" in found else "ASR"
        how = f"{parts[0]} alone: {unmeasured} not measured on this machine, so an upper bound"
    formula = f"{how}; the gateway's CPU is not in this estimate"
    smallest = min(found.values(), key=lambda f: f.value)
    found["engines"] = derived(smallest.value, "sessions", formula, found.values())
    return found
