"""Would a reply started on a partial transcript be the right one? How often tiny.en's
transcript of the speech so far, taken `d` ms before the end of the speech, already holds
the words of the final transcript.

    python -m benchmarks.partial_speculation \
        --out benchmarks/results/partial_speculation_tiny_en.json

The reply prepared during the pause (docs/turn-taking.md) starts on the transcript of
the first 64 ms pause: the LLM's request leaves ~150–200 ms after the last voiced sample
on a 2-core machine. An `openai` agent with a 300 ms time to first token gives its first
audio ~500 ms after that request at best, so a 500 ms voice-to-voice needs the request to
leave about when the speech ends: on a transcript of audio that stops before it does
("speculation on partial transcripts", not built). This measures what such a transcript
holds. Each sentence of the labelled set (benchmarks/turn_taking.py: tuning and held-out
parts, complete sentences only) is spoken whole in two voices; its reference is tiny.en's
transcript of the whole clip with 64 ms of silence after the last voiced sample (what the
pause's speculation hears), and each cut `d` is the transcript of the audio up to `d` ms
before that sample. A cut *matches* when its words (lower case, no punctuation) are the
reference's. Nothing is chosen on these figures: they say whether the
design is worth building, and at what cost (the engine's time per call is reported
beside them).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.turn_taking import HELD_OUT, SET, TUNING_MORE
from benchmarks.voices import RATE, Voice, espeak, piper
from services.common.audio.pcm import speech_end
from services.common.stats import summary
from services.loadtest.report import write
from services.loadtest.stats import words

VOICES: dict[str, Voice] = {
    "espeak en-us 150 wpm": espeak("en-us", 150),
    "piper joe 1.1": piper(1.1),
}
CUTS_MS = (50, 100, 150, 200, 300, 400)
PAD_MS = 64
"""Silence after the last voiced sample in the reference: the speculation's pause."""


def clip(audio: np.ndarray, end: int) -> np.ndarray:
    """The audio up to sample `end`, then `PAD_MS` of silence (the VAD hears a pause)."""
    pad = np.zeros(RATE * PAD_MS // 1000, dtype=np.float32)
    return np.concatenate([audio[:end].astype(np.float32), pad])


def measure(sentences: list[str]) -> dict[str, Any]:
    from services.asr.engines.base import AsrInput
    from services.asr.engines.whisper import FasterWhisperEngine
    from services.asr.settings import WhisperSettings

    engine = FasterWhisperEngine(WhisperSettings(model="tiny.en"))
    engine.load()
    engine.transcribe_batch([AsrInput(VOICES["piper joe 1.1"]("hello there"))])  # warm-up
    rows: list[dict[str, Any]] = []
    call_ms: list[float] = []
    for voice, say in VOICES.items():
        for sentence in sentences:
            audio = say(sentence)
            end = speech_end(audio)
            heard: dict[str, str] = {}
            for cut in ("reference", *CUTS_MS):
                stop = end if cut == "reference" else end - RATE * int(cut) // 1000
                started = time.perf_counter()
                (transcript,) = engine.transcribe_batch([AsrInput(clip(audio, stop))])
                call_ms.append(1000 * (time.perf_counter() - started))
                heard[str(cut)] = transcript.text
            reference = words(heard["reference"])
            rows.append(
                {
                    "voice": voice,
                    "sentence": sentence,
                    "speech_ms": round(1000 * end / RATE),
                    "heard": heard,
                    "matches": {str(d): words(heard[str(d)]) == reference for d in CUTS_MS},
                }
            )

    def matched(d: int, voice: str | None = None) -> int:
        return sum(row["matches"][str(d)] for row in rows if voice in (None, row["voice"]))

    n = len(rows)
    return {
        "turns": n,
        "by_cut": {
            f"{d} ms before": {"match": matched(d), "of": n, "rate": round(matched(d) / n, 3)}
            for d in CUTS_MS
        },
        "by_voice": {
            voice: {f"{d} ms before": matched(d, voice) for d in CUTS_MS} for voice in VOICES
        },
        "asr_call_ms": summary(call_ms),
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    sentences = [sentence for sentence, _, _ in (*SET, *TUNING_MORE, *HELD_OUT)]
    result = measure(sentences)
    for cut, found in result["by_cut"].items():
        print(f"{cut}: {found['match']} of {found['of']} ({found['rate']:.0%})")
    print("tiny.en call p50 / p95 ms:", result["asr_call_ms"])
    write(
        args.out,
        {
            "benchmark": "partial_speculation",
            "engine": "faster-whisper tiny.en int8, beam 1, one thread (the default)",
            "voices": list(VOICES),
            "pad_ms": PAD_MS,
            **result,
        },
    )


if __name__ == "__main__":
    main()
