"""Where a level's voice-to-voice goes: the services' own histograms, differenced.

Each service's /metrics is read when the measured window opens and when the level ends;
the difference of a histogram's sum and count is the mean over the level's jobs (exact),
the difference of its buckets gives an approximate p95 (linear inside the bucket, as
Prometheus' histogram_quantile does). Stages, in milliseconds:

hearing          gateway: end of the user's speech → end of turn decided (VAD + silence)
asr_after_turn   gateway: ASR round trip left after the turn ended (mean only: a
                 speculative transcript started at a pause hides the rest)
asr_queue_wait   ASR service: a final utterance waiting in the batcher
asr_compute      ASR service: the model call that transcribed it
agent            gateway: a reply's start → the agent's first text
tts_queue_wait   TTS service: a sentence waiting for a synthesis slot
tts_first_piece  TTS service: slot → its first audio chunk
pacing           gateway's first TTS job → first frame sent, less the TTS wait and first
                 piece: the bus both ways and the start of the paced playout (mean only)
delivery         the client's voice-to-voice less the gateway's: socket and both event
                 loops (mean only)

TTS figures are over every sentence, not only each reply's first. The stage that grows is
the one whose mean grew most since the first level.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

HISTOGRAMS: Final[dict[str, dict[str, tuple[str, dict[str, str]]]]] = {
    "gateway": {
        "hearing": ("va_gateway_end_of_turn_delay_seconds", {}),
        "gateway_asr": ("va_gateway_asr_seconds", {}),
        "agent": ("va_gateway_agent_first_token_seconds", {}),
        "gateway_tts": ("va_gateway_tts_first_audio_seconds", {}),
        "gateway_v2v": ("va_voice_to_voice_seconds", {}),
    },
    "asr": {
        "asr_latency": ("va_asr_latency_seconds", {"mode": "final"}),
        "asr_queue_wait": ("va_asr_queue_wait_seconds", {"mode": "final"}),
        "asr_compute": ("va_asr_compute_seconds", {"mode": "final"}),
    },
    "tts": {
        "tts_queue_wait": ("va_tts_queue_wait_seconds", {}),
        "tts_first_piece": ("va_tts_first_audio_seconds", {}),
    },
}
"""Per service: the histograms read, by the name the breakdown gives them."""
COUNTERS: Final[dict[str, dict[str, str]]] = {
    "gateway": {
        "speculative_asr": "va_gateway_speculative_asr_total",
        "prepared_replies": "va_gateway_prepared_replies_total",
    },
}
"""Per service: the counters read (summed over their labels), by the name given them here:
whether the gateway started any engine work before `speech.stopped`."""
MEASURED: Final = (
    "hearing",
    "asr_queue_wait",
    "asr_compute",
    "agent",
    "tts_queue_wait",
    "tts_first_piece",
)
"""Stages read straight from one histogram (mean, p95 and count)."""
DERIVED: Final = ("asr_after_turn", "pacing", "delivery")
"""Stages that are differences of means (mean only)."""
GROWING: Final = (*MEASURED, "pacing", "delivery")
"""Where the stage that grows is looked for (asr_after_turn is the ASR's share of what the
hearing already covers: it repeats the ASR stages)."""


@dataclass(frozen=True)
class Histogram:
    """One histogram at one moment (its series summed over the labels asked for)."""

    sum: float
    count: float
    buckets: tuple[tuple[float, float], ...]
    """(upper bound, cumulative count), ascending; the last bound is +Inf."""

    def minus(self, earlier: Histogram | None) -> Histogram:
        if earlier is None:
            return self
        before = dict(earlier.buckets)
        return Histogram(
            self.sum - earlier.sum,
            self.count - earlier.count,
            tuple((le, n - before.get(le, 0.0)) for le, n in self.buckets),
        )

    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def quantile(self, q: float) -> float | None:
        """Approximate quantile: linear inside the bucket it falls in; in the +Inf bucket,
        the largest finite bound (a lower bound)."""
        if self.count <= 0:
            return None
        rank = q * self.count
        lower, below = 0.0, 0.0
        for le, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(le):
                    return lower
                inside = cumulative - below
                share = (rank - below) / inside if inside > 0 else 1.0
                return lower + (le - lower) * share
            lower, below = le, cumulative
        return lower


def histograms(samples: list[Any], service: str) -> dict[str, Histogram]:
    """The breakdown's histograms of one service from its parsed /metrics samples
    (prometheus_client's `Sample`s of every family)."""
    found: dict[str, Histogram] = {}
    for key, (metric, labels) in HISTOGRAMS.get(service, {}).items():
        total, count, buckets = 0.0, 0.0, dict[float, float]()
        seen = False
        for sample in samples:
            if not sample.name.startswith(metric):
                continue
            if any(sample.labels.get(k) != v for k, v in labels.items()):
                continue
            suffix = sample.name.removeprefix(metric)
            if suffix == "_sum":
                total += sample.value
                seen = True
            elif suffix == "_count":
                count += sample.value
            elif suffix == "_bucket":
                le = float(sample.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + sample.value
        if seen:
            found[key] = Histogram(total, count, tuple(sorted(buckets.items())))
    return found


def counters(samples: list[Any], service: str) -> dict[str, float]:
    """The counters of `COUNTERS` one service exports, from its parsed /metrics samples; a
    counter never incremented is 0. Empty when no samples were read (the service's
    /metrics did not answer): nothing is known."""
    names = COUNTERS.get(service, {})
    if not samples or not names:
        return {}
    found = dict.fromkeys(names, 0.0)
    for key, metric in names.items():
        found[key] = sum(s.value for s in samples if s.name == metric)
    return found


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def breakdown(
    start: Mapping[str, Histogram], end: Mapping[str, Histogram], client_v2v_mean_ms: float | None
) -> dict[str, dict[str, float | int | None]]:
    """The level's stages (module docstring): `mean`, `p95` and `count` per stage, from the
    histograms at the window's start and the level's end. A stage whose service was not
    watched or did no work is left out."""
    level = {key: hist.minus(start.get(key)) for key, hist in end.items()}
    out: dict[str, dict[str, float | int | None]] = {}
    for stage in MEASURED:
        hist = level.get(stage)
        if hist is not None and hist.count > 0:
            out[stage] = {
                "mean": _ms(hist.mean()),
                "p95": _ms(hist.quantile(0.95)),
                "count": int(hist.count),
            }
    means = {key: mean for key, hist in level.items() if (mean := hist.mean()) is not None}

    def derived(value: float | None) -> dict[str, float | int | None]:
        return {"mean": _ms(value), "p95": None, "count": None}

    if "gateway_asr" in means and "hearing" in means:
        out["asr_after_turn"] = derived(means["gateway_asr"] - means["hearing"])
    if "gateway_tts" in means:
        tts = sum(means.get(key, 0.0) for key in ("tts_queue_wait", "tts_first_piece"))
        out["pacing"] = derived(means["gateway_tts"] - tts)
    if "gateway_v2v" in means and client_v2v_mean_ms is not None:
        out["delivery"] = derived(client_v2v_mean_ms / 1000 - means["gateway_v2v"])
    return out


def engine_ms(start: Mapping[str, Histogram], end: Mapping[str, Histogram]) -> float | None:
    """The engines' mean own time per turn (ASR final + TTS slot wait + first piece), ms.

    None unless both the ASR's and the TTS's histograms were read and both did work in
    between: with one engine missing the sum would be a different quantity.
    """
    means: dict[str, float] = {}
    for key in ("asr_latency", "tts_queue_wait", "tts_first_piece"):
        hist = end.get(key)
        mean = hist.minus(start.get(key)).mean() if hist is not None else None
        if mean is not None:
            means[key] = mean * 1000
    if "asr_latency" not in means or not {"tts_queue_wait", "tts_first_piece"} & means.keys():
        return None
    return sum(means.values())


def gateway_added_omitted(
    engine: float | None, start: Mapping[str, float], end: Mapping[str, float]
) -> str | None:
    """Why a level's `gateway_added` (speech.stopped → first audio, less the engines' mean
    time) would mean nothing, so is left out; None: it means the gateway's own time.

    It needs both engines' time (`engine`: --asr-url and --tts-url) and a gateway that did
    no engine work before `speech.stopped` (its speculation counters, `start` and `end`,
    read and unchanged over the level): a transcript started at a pause, or a reply
    prepared on it, is engine time spent before the turn ended, and subtracting it made
    the figure negative.
    """
    if engine is None:
        return "needs both engines' own time: give --asr-url and --tts-url"
    if not end:
        return "the gateway's /metrics was not read: its speculation is unknown"
    early = {key: end.get(key, 0.0) - start.get(key, 0.0) for key in COUNTERS["gateway"]}
    if any(value > 0 for value in early.values()):
        return (
            f"the gateway started engine work before speech.stopped ("
            f"{early['speculative_asr']:.0f} speculative transcripts, "
            f"{early['prepared_replies']:.0f} prepared replies in the level): subtracting "
            "the engines' time would undercount; run it with "
            "VA_GATEWAY__SPECULATIVE_ASR=false"
        )
    return None


def growing_stage(
    first: Mapping[str, Mapping[str, Any]], level: Mapping[str, Mapping[str, Any]]
) -> str | None:
    """The stage whose mean grew most from the first level to this one (None: none grew)."""
    growth = {
        stage: level[stage]["mean"] - first[stage]["mean"]
        for stage in GROWING
        if level.get(stage, {}).get("mean") is not None
        and first.get(stage, {}).get("mean") is not None
    }
    if not growth:
        return None
    stage = max(growth, key=lambda s: growth[s])
    return stage if growth[stage] > 0 else None
