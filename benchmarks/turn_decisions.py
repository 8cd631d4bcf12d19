"""smart-turn's decisions replayed offline, on a tuning part and a held-out part of the
labelled set: each configuration in seconds rather than minutes.

    python -m benchmarks.turn_decisions --recording /tmp/turns.pkl \\
        --out benchmarks/results/turn_decisions_lite.json

The end-to-end benchmark (turn_taking.py) hears each utterance once per configuration,
and its cut-offs move with what tiny.en happens to hear at the end of a fragment, which
changes with where the VAD starts the utterance. This one records once what the stack's
parts make of every utterance under several framings (leading silences 24 ms apart, so
the VAD's 32 ms windows fall differently): the VAD's pauses (Silero and the gateway's
segmenter), the speculative transcript of each pause (tiny.en with its scores) and Smart
Turn's probability at each ask (the pause, then every recheck, on the audio the session
would send). Then it replays the decisions with the policy's own code
(`SmartTurn.turn_complete`, the model's answers looked up) under each configuration:

- complete turns: the time from the end of the voice to the decision: the VAD's lag, the
  silence the policy waits, and the compute (the pause's transcript is in `--heard-at-ms`
  into the silence; a model call takes `--model-ms`); and what ended the turn — the model,
  the unsure wait, the doubt wait, the fallback, or a pause inside the sentence;
- incomplete ones: a false cut-off when the turn ends before the speaker goes on
  (`--gap-ms` of silence) — at the fragment's end, or at a pause inside it.

`silence 600 ms` is the plain silence policy on the same recordings. Thresholds are chosen
on the tuning part only (`--search`: a grid, and the ranking in `badness`); the held-out part
(other sentences, three voices of its four unheard in tuning) is reported beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.turn_taking import PARTS, Utterance, labelled_set
from benchmarks.voices import RATE
from services.common.audio.pcm import AudioF32, speech_end
from services.common.stats import summary
from services.gateway.settings import GatewaySection
from services.gateway.turn_end import Heard, SmartTurn
from services.loadtest.report import write

CHUNK = 320  # 20 ms frames, as clients send
SILENCE_MS = 600  # the silence policy's VA_VAD__MIN_SILENCE_MS
TARGETS = {"false_cut_off_rate": 0.03, "complete_waiting_timer_rate": 0.02, "p95_ms": 600.0}
"""On the held-out part (issue 24): fragments answered, complete turns that wait the
doubt wait or the fallback, and p95 from the end of the voice to the decision."""

LOOKS_WHOLE = "looks whole"
"""Fragments whose words and prosody make a finished sentence ("Turn on the heating" | "in
the living room"): a speaker who goes on after one extends a finished turn. Reported, and
left out of `false_cut_off_rate_said_kinds` (the issue's kinds: lists, digits and codes,
fillers, restarts, mid-phrase)."""

PREVIOUS = {
    "end_of_turn_unsure_ms": 500,
    "end_of_turn_transcript_logprob": -0.5,
    "end_of_turn_last_word_logprob": -0.6,
    "end_of_turn_doubt_ms": 1300,
    "end_of_turn_no_new_words": True,
}
"""The defaults before this benchmark had a held-out part (fitted on the first 40)."""

CONFIGS: dict[str, dict[str, Any]] = {
    "smart-turn (defaults)": {},
    "defaults, a transcript that only trails off ('...') judged by the model": {
        "mid_thought": "model"
    },
    "previous defaults (fitted on the first 40 utterances)": PREVIOUS,
    "model alone (no word rules, ASR scores unread, no unsure wait)": {
        "mid_thought": False,
        "end_of_turn_no_new_words": False,
        "end_of_turn_transcript_logprob": None,
        "end_of_turn_last_word_logprob": None,
        "end_of_turn_unsure_ms": 2000,
    },
    "previous defaults, ASR scores unread": {
        **PREVIOUS,
        "end_of_turn_transcript_logprob": None,
        "end_of_turn_last_word_logprob": None,
    },
    "previous defaults, without the mid-thought words rule": {**PREVIOUS, "mid_thought": False},
    "previous defaults, without the no-new-words rule": {
        **PREVIOUS,
        "end_of_turn_no_new_words": False,
    },
}
"""Each against GatewaySection's defaults; `mid_thought: False` turns the mid-thought words
rule off (it has no setting), `"model"` lets the model judge a transcript that ends
mid-thought by its punctuation alone."""

GRID: dict[str, list[Any]] = {
    "smart_turn_threshold": [0.5, 0.3, 0.7],
    "end_of_turn_unsure_ms": [500, 100, 300, 700],
    "end_of_turn_transcript_logprob": [-0.5, None, -0.4, -0.6, -0.8],
    "end_of_turn_last_word_logprob": [-0.6, None, -0.8, -1.0],
    "end_of_turn_doubt_ms": [1300, 500, 700, 900],
    "end_of_turn_no_new_words": [True, False],
    "mid_thought": [True, False],
}
"""`--search`: every combination, replayed on the tuning part; each list starts with the
previous default, so that of configurations that rank the same the default stays."""

RULES: dict[str, dict[str, Any]] = {
    "mid-thought words": {"mid_thought": False},
    "no new words": {"end_of_turn_no_new_words": False},
    "transcript doubt": {"end_of_turn_transcript_logprob": None},
    "last-word doubt": {"end_of_turn_last_word_logprob": None},
    "unsure wait (the model's 'incomplete' heard)": {"end_of_turn_unsure_ms": 100},
}
"""Each rule of the policy and the override that takes it out."""


@dataclass
class Pause:
    """One pause of a framed utterance: what the session would know there."""

    audio: AudioF32  # the speculative transcript's audio (dropped once heard)
    silence_ms: int  # how long the silence lasted (until speech or the end of the clip)
    asks: list[tuple[int, int]] = field(default_factory=list)  # (silence, samples asked)
    heard: Heard | None = None
    probabilities: list[float] = field(default_factory=list)
    began_ms: int = 0  # where the VAD's silence began in the framed audio
    ask_audio: list[AudioF32] = field(default_factory=list)  # (dropped once heard)


@dataclass
class Framed:
    utterance: Utterance
    lead_ms: int
    pauses: list[Pause]
    voice_end_ms: int = 0  # where the voice ends in the framed audio


def frame(utterance: Utterance, lead_ms: int, settings: GatewaySection) -> Framed:
    """The pauses the gateway's VAD finds in the utterance (its first part) after
    `lead_ms` of silence, each with the audio of every ask the session would make."""
    from services.common.audio.turns import SpeechPause, TurnSegmenter
    from services.common.audio.vad import VadSettings
    from services.gateway.turn_end import listening

    vad = _vad()
    hearing = listening(SmartTurn(settings), VadSettings(), settings)
    segmenter = TurnSegmenter(hearing)
    stream = vad.new_stream()
    tail = np.zeros(RATE * (settings.end_of_turn_fallback_ms + 500) // 1000, np.float32)
    lead = np.zeros(RATE * lead_ms // 1000, np.float32)
    audio = np.concatenate([lead, utterance.first, tail])
    pauses: list[Pause] = []
    current: tuple[Pause, int] | None = None  # the open pause, where its silence began
    for start in range(0, audio.size, CHUNK):
        chunk = audio[start : start + CHUNK]
        for event in segmenter.feed(chunk, stream.push(chunk)):
            if isinstance(event, SpeechPause):
                current = (Pause(event.audio, 0, began_ms=event.end_ms), event.end_ms)
                pauses.append(current[0])
        if current is None:
            continue
        pause, began = current
        if segmenter.silence_start_ms != began:  # speech again, or the turn ended
            current = None
            continue
        silence = segmenter.trailing_silence_ms
        pause.silence_ms = silence
        due = settings.end_of_turn_first_ask_ms + len(pause.asks) * settings.end_of_turn_recheck_ms
        if silence >= due:
            asked = segmenter.current_audio()
            pause.asks.append((silence, asked.size))
            pause.ask_audio.append(asked)
    voice_end = lead_ms + speech_end(utterance.first) * 1000 // RATE
    return Framed(utterance, lead_ms, pauses, voice_end)


@functools.cache
def _vad() -> Any:
    from services.common.audio.vad import SileroVad

    return SileroVad()


def hear(framed: list[Framed]) -> None:
    """Each pause's speculative transcript (tiny.en, with its scores) and Smart Turn's
    probability at each of its asks."""
    from services.asr.engines.base import AsrInput
    from services.asr.engines.whisper import FasterWhisperEngine
    from services.asr.settings import WhisperSettings
    from services.gateway.smart_turn import shared_model

    engine = FasterWhisperEngine(WhisperSettings(model="tiny.en"))  # last-word scores: on
    engine.load()
    model = shared_model(1)
    for item in framed:
        transcripts = engine.transcribe_batch([AsrInput(p.audio) for p in item.pauses])
        before = None
        for pause, transcript in zip(item.pauses, transcripts, strict=True):
            pause.heard = Heard(
                transcript.text,
                last_word_logprob=transcript.last_word_logprob,
                before=before,
                avg_logprob=transcript.avg_logprob,
            )
            before = transcript.text
            if pause.ask_audio:  # a pause shorter than the first ask is never asked about
                pause.probabilities = model.predict(pause.ask_audio)


def slim(framed: list[Framed]) -> None:
    """Drop the audio a replay does not need (each ask keeps its length), to store it."""
    empty = np.zeros(0, np.float32)
    for item in framed:
        item.utterance.first = empty
        item.utterance.rest = None
        for pause in item.pauses:
            pause.audio = empty
            pause.ask_audio = []


_ZEROS = np.zeros(RATE * 60, np.float32)


def _zeros(size: int) -> AudioF32:
    """A view of `size` samples of one shared buffer: the model's answers are looked up by
    the length of the audio it is asked about."""
    return _ZEROS[:size]


class Recorded:
    """Stands in for the model's batcher: the probabilities recorded for one pause."""

    def __init__(self, pause: Pause) -> None:
        asks = zip(pause.asks, pause.probabilities, strict=True)
        self.by_size = {size: p for (_, size), p in asks}
        self.asked = 0

    async def probability(self, audio: AudioF32) -> float:
        self.asked += 1
        return self.by_size[audio.size]


class Policy(SmartTurn):
    """SmartTurn, with its mid-thought words rule left out when `mid_thought` is False, and
    a transcript that only trails off judged by the model when it is "model"."""

    def __init__(self, settings: GatewaySection, mid_thought: bool | str) -> None:
        super().__init__(settings)
        self.mid_thought_rule = bool(mid_thought)
        self.trailing_off_asks_model = mid_thought == "model"


@dataclass
class Decision:
    at_ms: int  # silence at which the turn ends, compute included
    why: str  # model, unsure, doubt, words (never for a True), fallback


async def decide(
    policy: SmartTurn, pause: Pause, heard_at_ms: int, model_ms: int, least_ms: int = 0
) -> Decision | None:
    """When, and why, the policy ends the turn in this pause (None: it does not, or the
    speaker went on first). A decision waits for the transcript, known `heard_at_ms` into
    the silence, and for the model when it was asked (`model_ms` a call); the turn ends
    no sooner than `least_ms` of silence (`end_of_turn_min_silence_ms`)."""
    recorded = Recorded(pause)
    policy.batcher = recorded  # type: ignore[assignment]
    known: asyncio.Future[Heard | None] = asyncio.get_running_loop().create_future()
    known.set_result(pause.heard)
    for (silence, size), p in zip(pause.asks, pause.probabilities, strict=True):
        recorded.asked = 0
        if await policy.turn_complete(_zeros(size), known, silence):
            at = max(silence + model_ms * recorded.asked, heard_at_ms, least_ms)
            return Decision(at, _why(policy, pause.heard, p)) if at <= pause.silence_ms else None
    return None


def _why(policy: SmartTurn, heard: Heard | None, probability: float) -> str:
    """What ended a turn the policy called complete (mirrors `SmartTurn._by_words`)."""
    if heard is not None and heard.doubted(policy.transcript_logprob, policy.last_word_logprob):
        return "doubt"
    return "model" if probability >= policy.threshold else "unsure"


async def replay(
    framed: list[Framed],
    overrides: dict[str, Any],
    gap_ms: int,
    heard_at_ms: int,
    model_ms: int = 0,
    details: bool = True,
) -> dict[str, Any]:
    """One configuration on `framed`; `overrides` of GatewaySection, or {"silence": True}
    for the silence policy."""
    settings = _settings(overrides)
    policy = Policy(settings, overrides.get("mid_thought", True))
    fallback = settings.end_of_turn_fallback_ms
    latency: list[float] = []
    silences: list[float] = []
    why: dict[str, int] = {}
    cut = fragments = 0
    cut_kinds: dict[str, int] = {}
    kinds: dict[str, int] = {}
    misses: list[dict[str, Any]] = []
    for item in framed:
        if overrides.get("silence"):
            decided: list[Decision | None] = [
                Decision(SILENCE_MS, "silence") if p.silence_ms >= SILENCE_MS else None
                for p in item.pauses
            ]
        else:
            least = settings.end_of_turn_min_silence_ms
            decided = [await decide(policy, p, heard_at_ms, model_ms, least) for p in item.pauses]
        early = next((i for i, d in enumerate(decided[:-1]) if d is not None), None)
        last = decided[-1]
        if item.utterance.complete:
            if early is not None:
                why["inside"] = why.get("inside", 0) + 1
                continue
            ended = last if last and last.at_ms < fallback else Decision(fallback, "fallback")
            why[ended.why] = why.get(ended.why, 0) + 1
            lag = item.pauses[-1].began_ms - item.voice_end_ms
            latency.append(float(lag + ended.at_ms))
            silences.append(float(ended.at_ms))
            continue
        fragments += 1
        kinds[item.utterance.kind] = kinds.get(item.utterance.kind, 0) + 1
        if early is None and (last is None or last.at_ms >= gap_ms):
            continue
        cut += 1
        kind = item.utterance.kind
        cut_kinds[kind] = cut_kinds.get(kind, 0) + 1
        which = len(decided) - 1 if early is None else early
        heard = item.pauses[which].heard
        ended_at = decided[which]
        misses.append(
            {
                "fragment": item.utterance.fragment_text,
                "voice": item.utterance.voice,
                "lead_ms": item.lead_ms,
                "pause": f"{which + 1} of {len(decided)}",
                "heard": heard.text if heard else None,
                "before": heard.before if heard else None,
                "avg_logprob": _round(heard.avg_logprob if heard else None),
                "last_word_logprob": _round(heard.last_word_logprob if heard else None),
                "ended_at_silence_ms": ended_at.at_ms if ended_at else None,
                "why": ended_at.why if ended_at else None,
            }
        )
    complete = sum(1 for f in framed if f.utterance.complete)
    waiting = why.get("doubt", 0) + why.get("fallback", 0)
    result: dict[str, Any] = {
        "settings": overrides,
        "decision_ms": summary(latency) if latency else None,
        "end_of_turn_silence_ms": summary(silences) if silences else None,
        "complete": complete,
        "complete_ended_by": dict(sorted(why.items())),
        "complete_waiting_timer": waiting,
        "complete_waiting_timer_rate": round(waiting / max(1, complete), 3),
        "incomplete": fragments,
        "false_cut_offs": cut,
        "false_cut_off_rate": round(cut / max(1, fragments), 3),
        "false_cut_offs_by_kind": {
            k: f"{cut_kinds.get(k, 0)} of {n}" for k, n in sorted(kinds.items())
        },
        "false_cut_off_rate_said_kinds": round(
            (cut - cut_kinds.get(LOOKS_WHOLE, 0)) / max(1, fragments - kinds.get(LOOKS_WHOLE, 0)), 3
        ),
        "complete_cut_inside": why.get("inside", 0),
    }
    if details:
        result["cut_offs"] = misses
    return result


def meets(result: dict[str, Any]) -> bool:
    """Whether a replay meets the targets."""
    return max(_over(result)) <= 1.0


def _over(result: dict[str, Any]) -> tuple[float, float, float]:
    """Each measure over its target: fragments and complete sentences answered too soon,
    complete turns waiting a timer, p95."""
    eot = result["decision_ms"] or {"p95": float("inf")}
    cut = result["false_cut_offs"] + result["complete_cut_inside"]
    return (
        cut / max(1, result["incomplete"]) / TARGETS["false_cut_off_rate"],
        result["complete_waiting_timer_rate"] / TARGETS["complete_waiting_timer_rate"],
        eot["p95"] / TARGETS["p95_ms"],
    )


def badness(result: dict[str, Any]) -> tuple[float, ...]:
    """How a configuration ranks on the tuning part (lower is better). The complete turns'
    targets come first (no timer, p95 within 600 ms: the issue's "no complete sentence
    should wait"): among the configurations that meet both, the fewest cut-offs
    (fragments, and sentences answered at a pause inside them), then the lowest p95, then
    p50; when none meets both, the nearest (the worst of the three over its target)."""
    cut, timer, p95 = _over(result)
    eot = result["decision_ms"] or {"p50": float("inf"), "p95": float("inf")}
    times = (round(eot["p95"], -1), round(eot["p50"], -1))  # within 10 ms: the same
    if max(timer, p95) <= 1.0:
        return (0.0, cut, *times)
    return (1.0, max(cut, timer, p95), *times)


def search(framed: list[Framed], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every combination of GRID on `framed` (the tuning part), best first."""
    names = list(GRID)
    found = []
    for values in itertools.product(*GRID.values()):
        overrides = dict(zip(names, values, strict=True))
        if (
            overrides["end_of_turn_transcript_logprob"] is None
            and overrides["end_of_turn_last_word_logprob"] is None
            and overrides["end_of_turn_doubt_ms"] != GRID["end_of_turn_doubt_ms"][0]
        ):
            continue  # nothing is doubted: the doubt wait does not matter
        found.append(
            asyncio.run(
                replay(framed, overrides, args.gap_ms, args.heard_at_ms, args.model_ms, False)
            )
        )
    return sorted(found, key=badness)


def _settings(overrides: dict[str, Any]) -> GatewaySection:
    return GatewaySection(
        **{k: v for k, v in overrides.items() if k not in ("mid_thought", "silence")}
    )


def without(overrides: dict[str, Any], rule: str) -> dict[str, Any] | None:
    """`overrides` with `rule` taken out (None: it is not in them)."""
    ((name, off),) = RULES[rule].items()
    if name == "mid_thought":
        now = overrides.get("mid_thought", True)
    else:
        now = getattr(_settings(overrides), name)
    return None if now == off else {**overrides, name: off}


def ablate(
    framed: dict[str, list[Framed]], chosen: dict[str, Any], args: argparse.Namespace
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each rule of `chosen` taken out in turn, on both parts; the rules that do not help on
    the held-out part (it ranks no worse without them, by `badness`) are dropped, one at a
    time, the least useful first. The default that is left, and each step."""

    def run(overrides: dict[str, Any], part: str) -> dict[str, Any]:
        return asyncio.run(
            replay(framed[part], overrides, args.gap_ms, args.heard_at_ms, args.model_ms, False)
        )

    kept = dict(chosen)
    steps: dict[str, Any] = {}
    while True:
        base = badness(run(kept, "held-out"))
        trials = {}
        for rule in RULES:
            less = without(kept, rule)
            if less is not None:
                trials[rule] = (less, {part: run(less, part) for part in PARTS})
        steps[f"from {kept}"] = {
            rule: {"helps on held-out": badness(r["held-out"]) > base, **r}
            for rule, (_, r) in trials.items()
        }
        useless = [
            (badness(r["held-out"]), rule)
            for rule, (_, r) in trials.items()
            if badness(r["held-out"]) <= base
        ]
        if not useless:
            return kept, steps
        kept = trials[min(useless)[1]][0]


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def record(framings: int) -> list[Framed]:
    """Both parts of the labelled set, framed and heard."""
    leads = [500 + 24 * k for k in range(framings)]
    settings = GatewaySection()
    utterances = labelled_set()
    framed = [frame(u, lead, settings) for u in utterances for lead in leads]
    framed = [f for f in framed if f.pauses]
    hear(framed)
    slim(framed)
    return framed


def _line(name: str, part: str, result: dict[str, Any]) -> str:
    eot = result["decision_ms"] or {"p50": 0.0, "p95": 0.0}
    return (
        f"{name[:48]:48} {part:8} p50 {eot['p50']:5.0f} p95 {eot['p95']:5.0f}  "
        f"timer {result['complete_waiting_timer']:3}/{result['complete']}  "
        f"cut {result['false_cut_offs']:3}/{result['incomplete']}  "
        f"{result['complete_ended_by']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gap-ms", type=int, default=1000, help="pause inside incomplete turns")
    parser.add_argument(
        "--heard-at-ms",
        type=int,
        default=250,
        help="silence by which a pause's transcript is in (the pause, then tiny.en on a "
        "busy 2-core CPU)",
    )
    parser.add_argument("--model-ms", type=int, default=70, help="one Smart Turn call")
    parser.add_argument("--framings", type=int, default=4)
    parser.add_argument(
        "--recording", type=Path, help="pickle of the recordings: read if there, else written"
    )
    parser.add_argument("--search", action="store_true", help="grid search on the tuning part")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.recording and args.recording.exists():
        framed: list[Framed] = pickle.loads(args.recording.read_bytes())  # our own recording
    else:
        framed = record(args.framings)
        if args.recording:
            args.recording.write_bytes(pickle.dumps(framed))
    parts = {part: [f for f in framed if f.utterance.part == part] for part in PARTS}
    configs: dict[str, dict[str, Any]] = {"silence 600 ms": {"silence": True}, **CONFIGS}
    searched: list[dict[str, Any]] = []
    ablations: dict[str, Any] = {}
    if args.search:
        searched = search(parts["tuning"], args)
        configs["chosen on the tuning part"] = searched[0]["settings"]
        kept, ablations = ablate(parts, searched[0]["settings"], args)
        configs["chosen, less the rules that do not help on held-out"] = kept
    results: dict[str, dict[str, Any]] = {}
    for name, overrides in configs.items():
        results[name] = {
            part: asyncio.run(
                replay(parts[part], overrides, args.gap_ms, args.heard_at_ms, args.model_ms)
            )
            for part in PARTS
        }
        for part in PARTS:
            print(_line(name, part, results[name][part]))
    if args.out:
        write(
            args.out,
            {
                "benchmark": "turn_decisions",
                "profile": "tiny.en int8 + Silero VAD + Smart Turn v3.2, replayed offline",
                "set": {
                    part: {
                        "utterances": len(
                            {
                                (f.utterance.sentence, f.utterance.voice, f.utterance.complete)
                                for f in parts[part]
                            }
                        ),
                        "framed": len(parts[part]),
                        "voices": sorted({f.utterance.voice for f in parts[part]}),
                    }
                    for part in PARTS
                },
                "framings": sorted({f.lead_ms for f in framed}),
                "gap_ms": args.gap_ms,
                "heard_at_ms": args.heard_at_ms,
                "model_ms": args.model_ms,
                "targets": TARGETS,
                "configs": results,
                "search_top": searched[:20],
                "ablations": ablations,
                "searched": len(searched),
            },
        )


if __name__ == "__main__":
    main()
