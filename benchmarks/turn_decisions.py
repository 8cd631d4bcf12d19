"""smart-turn's decisions replayed offline: each configuration on eight framings of the
labelled set, in seconds rather than minutes each.

    python -m benchmarks.turn_decisions --out benchmarks/results/turn_decisions_lite.json

The end-to-end benchmark (turn_taking.py) hears each utterance once per configuration,
and its cut-offs move with what tiny.en happens to hear at the end of a fragment, which
changes with where the VAD starts the utterance: one run's 20 fragments cannot tell a
rule that removes one cut-off from noise. This one records once what the stack's parts
make of every utterance of the same set under eight framings (leading silences 12 ms
apart, so the VAD's 32 ms windows fall differently): the VAD's pauses (Silero and the
gateway's segmenter), the speculative transcript of each pause (tiny.en with its scores)
and Smart Turn's probability at each ask (the pause, then every recheck, on the audio the
session would send). Then it replays the decisions with the policy's own code
(`SmartTurn.turn_complete`, the model's answers looked up) under each configuration:

- complete turns: the silence after the last words at which the turn ends (the time to
  compute the answer is not counted: see turn_taking.py for that), and turns ended at a
  pause inside the sentence;
- incomplete ones: a false cut-off when the turn ends before the speaker goes on
  (`--gap-ms` of silence) — at the fragment's end, or at a pause inside it.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.turn_taking import Utterance, labelled_set
from benchmarks.voices import RATE
from services.common.audio.pcm import AudioF32
from services.common.stats import summary
from services.gateway.settings import GatewaySection
from services.gateway.turn_end import Heard, SmartTurn
from services.loadtest.report import write

LEADS_MS = [500 + 12 * k for k in range(8)]
CHUNK = 320  # 20 ms frames, as clients send

CONFIGS: dict[str, dict[str, Any]] = {
    "smart-turn (defaults)": {},
    "transcript never doubted": {"end_of_turn_transcript_logprob": None},
    "last word never doubted": {"end_of_turn_last_word_logprob": None},
    "ASR scores unread": {
        "end_of_turn_transcript_logprob": None,
        "end_of_turn_last_word_logprob": None,
    },
    "transcript doubted below -0.4": {"end_of_turn_transcript_logprob": -0.4},
    "transcript doubted below -0.6": {"end_of_turn_transcript_logprob": -0.6},
    "last word doubted below -0.4": {"end_of_turn_last_word_logprob": -0.4},
    "last word doubted below -0.8": {"end_of_turn_last_word_logprob": -0.8},
    "unsure 300 ms": {"end_of_turn_unsure_ms": 300},
    "unsure 700 ms": {"end_of_turn_unsure_ms": 700},
    "unsure 1000 ms": {"end_of_turn_unsure_ms": 1000},
}
"""Each against GatewaySection's defaults; `unsure` stays on the asks' grid."""


@dataclass
class Pause:
    """One pause of a framed utterance: what the session would know there."""

    audio: AudioF32  # the speculative transcript's audio
    silence_ms: int  # how long the silence lasted (until speech or the end of the clip)
    asks: list[tuple[int, AudioF32]] = field(default_factory=list)  # (silence, audio)
    heard: Heard | None = None
    probabilities: list[float] = field(default_factory=list)


@dataclass
class Framed:
    utterance: Utterance
    lead_ms: int
    pauses: list[Pause]


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
                current = (Pause(event.audio, 0), event.end_ms)
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
            pause.asks.append((silence, segmenter.current_audio()))
    return Framed(utterance, lead_ms, pauses)


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
            pause.probabilities = model.predict([audio for _, audio in pause.asks])


class Recorded:
    """Stands in for the model's batcher: the probabilities recorded for one pause."""

    def __init__(self, pause: Pause) -> None:
        asks = zip(pause.asks, pause.probabilities, strict=True)
        self.by_size = {audio.size: p for (_, audio), p in asks}

    async def probability(self, audio: AudioF32) -> float:
        return self.by_size[audio.size]


async def decide(policy: SmartTurn, pause: Pause, heard_at_ms: int) -> int | None:
    """The silence at which the policy ends the turn in this pause (None: it does not, or
    the speaker went on first). A decision waits for the transcript, known `heard_at_ms`
    into the silence."""
    policy.batcher = Recorded(pause)  # type: ignore[assignment]
    known: asyncio.Future[Heard | None] = asyncio.get_running_loop().create_future()
    known.set_result(pause.heard)
    for silence, audio in pause.asks:
        if await policy.turn_complete(audio, known, silence):
            at = max(silence, heard_at_ms)
            return at if at <= pause.silence_ms else None
    return None


async def replay(
    framed: list[Framed], overrides: dict[str, Any], gap_ms: int, heard_at_ms: int
) -> dict[str, Any]:
    settings = GatewaySection(**overrides)
    policy = SmartTurn(settings)
    ended: list[float] = []
    cut = inside = fragments = 0
    misses: list[dict[str, Any]] = []
    for item in framed:
        decided = [await decide(policy, pause, heard_at_ms) for pause in item.pauses]
        early = next((i for i, at in enumerate(decided[:-1]) if at is not None), None)
        at = decided[-1]
        if item.utterance.complete:
            inside += early is not None
            ended.append(float(settings.end_of_turn_fallback_ms if at is None else at))
            continue
        fragments += 1
        if early is None and (at is None or at >= gap_ms):
            continue
        cut += 1
        which = len(decided) - 1 if early is None else early
        heard = item.pauses[which].heard
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
                "ended_at_silence_ms": decided[which],
            }
        )
    slow = sorted(ended)
    return {
        "settings": overrides,
        "complete_end_of_turn_silence_ms": summary(slow),
        "complete_over_700_ms": sum(1 for s in slow if s > 700),
        "complete_ended_inside": inside,
        "complete": len(ended),
        "false_cut_offs": cut,
        "incomplete": fragments,
        "false_cut_off_rate": round(cut / max(1, fragments), 3),
        "cut_offs": misses,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


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
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    utterances = labelled_set()
    settings = GatewaySection()
    framed = [frame(u, lead, settings) for u in utterances for lead in LEADS_MS]
    framed = [f for f in framed if f.pauses]
    hear(framed)
    results = {
        name: asyncio.run(replay(framed, overrides, args.gap_ms, args.heard_at_ms))
        for name, overrides in CONFIGS.items()
    }
    for name, result in results.items():
        eot = result["complete_end_of_turn_silence_ms"]
        print(
            f"{name:50} end of turn p50 {eot['p50']:6.0f} p95 {eot['p95']:6.0f}  "
            f"over 700 ms {result['complete_over_700_ms']:3}/{result['complete']}  "
            f"inside {result['complete_ended_inside']}  "
            f"cut-offs {result['false_cut_offs']:3}/{result['incomplete']}"
        )
    if args.out:
        write(
            args.out,
            {
                "benchmark": "turn_decisions",
                "profile": "tiny.en int8 + Silero VAD + Smart Turn v3.2, replayed offline",
                "set": {
                    "utterances": len(utterances),
                    "framings": LEADS_MS,
                    "gap_ms": args.gap_ms,
                    "heard_at_ms": args.heard_at_ms,
                },
                "configs": results,
            },
        )


if __name__ == "__main__":
    main()
