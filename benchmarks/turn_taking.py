"""Turn-taking on labelled speech: how soon each end-of-turn policy answers, how often it
cuts a speaker off, and what that does to voice-to-voice latency.

    python -m benchmarks.turn_taking --out benchmarks/results/turn_taking_lite.json

The set: ten sentences, each spoken whole (a *complete* turn) and cut mid-phrase or after
a filler (an *incomplete* one: the speaker stops for `--gap-ms`, then says the rest), each
in one espeak-ng voice and one Piper voice at different rates — 40 utterances. The cut is
made in the audio of the whole sentence (at a word boundary that faster-whisper's word
timestamps find), so the fragment keeps the rising, unfinished prosody of speech that goes
on; synthesizing the fragment as its own text would end it like a sentence.

Per configuration, a fresh lite stack (faster-whisper tiny.en + Piper + echo agent, as
`voice-agent up` runs it) hears the whole set through /v1/stream in one session:

- complete turns: end-of-turn delay (last speech frame sent → `speech.stopped`), the
  transcript's arrival, and voice-to-voice (→ first agent audio frame);
- incomplete turns: a *false cut-off* when the agent starts a response before the last
  `speech.stopped` of the utterance, i.e. it answered the fragment.

Each response is cancelled at its first audio frame, so the set takes minutes, not tens of
minutes. Smart Turn's own probabilities on every utterance (the fragment, and the whole
sentence, each with 200 ms of trailing silence) are recorded too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks.report import summary, write
from benchmarks.stack import lite_stack
from services.client.stream import Received, StreamClient
from services.common.audio import resample
from services.tts.engines.base import SpeechRequest
from services.tts.engines.piper import PiperEngine
from services.tts.settings import PiperSettings
from tests.speech import speak

Audio = npt.NDArray[np.float32]
RATE = 16000

# (sentence, the word the continuation starts with: the cut falls just before it)
SET: list[tuple[str, str]] = [
    ("What is the weather like in Paris today?", "Paris"),
    ("I would like to book a table for two people tonight.", "two"),
    ("Can you tell me, um, what time the museum opens?", "what"),
    ("Please remind me to call my sister tomorrow morning.", "call"),
    ("How long does it take to drive from Boston to New York?", "New"),
    ("I need a recipe for a quick vegetarian dinner.", "quick"),
    ("So, uh, I was wondering if you could help me with my order.", "I"),
    ("Could you play some relaxing music in the kitchen?", "relaxing"),
    ("My flight leaves at seven, and I need a taxi to the airport.", "I"),
    ("What is the difference between a crocodile and an alligator?", "an"),
]

CONFIGS: dict[str, dict[str, str]] = {
    "silence 600 ms, no speculation (before)": {
        "VA_GATEWAY__END_OF_TURN": "silence",
        "VA_GATEWAY__SPECULATIVE_ASR": "false",
    },
    "silence 600 ms": {"VA_GATEWAY__END_OF_TURN": "silence"},
    "heuristic": {"VA_GATEWAY__END_OF_TURN": "heuristic"},
    "smart-turn": {"VA_GATEWAY__END_OF_TURN": "smart-turn"},
}


@cache
def _piper() -> PiperEngine:
    engine = PiperEngine(PiperSettings())
    engine.load()
    return engine


def _piper_voice(speed: float) -> Callable[[str], Audio]:
    def say(text: str) -> Audio:
        request = SpeechRequest(text=text, voice="joe", speed=speed)
        audio = np.concatenate(list(_piper().synthesize(request)))
        return resample(audio, _piper().sample_rate, RATE)

    return say


ESPEAK: dict[str, Callable[[str], Audio]] = {
    "espeak en-us 160 wpm": lambda text: speak(text, RATE, "en-us", 160),
    "espeak en-gb 190 wpm": lambda text: speak(text, RATE, "en-gb", 190),
}
PIPER: dict[str, Callable[[str], Audio]] = {
    "piper joe 1.0": _piper_voice(1.0),
    "piper joe 1.2": _piper_voice(1.2),
}


@dataclass
class Utterance:
    sentence: str
    voice: str
    complete: bool
    first: Audio  # the whole sentence, or the fragment before the pause
    rest: Audio | None  # the continuation after the pause (incomplete only)
    fragment_text: str
    cut_found: bool


def _norm(word: str) -> str:
    return re.sub(r"[^a-z0-9']", "", word.lower())


@cache
def _whisper() -> Any:
    from faster_whisper import WhisperModel

    from services.asr.engines.whisper import TINY_EN

    return WhisperModel(str(TINY_EN.verify()), device="cpu", compute_type="int8")


def cut_point(audio: Audio, sentence: str, word: str) -> tuple[int, bool]:
    """The sample just before `word` (midway between it and the word before), found with
    word timestamps; (a share of the text's length, False) if the word was not heard."""
    segments, _ = _whisper().transcribe(audio, language="en", word_timestamps=True, beam_size=1)
    heard = [w for segment in segments for w in segment.words or []]
    target = _norm(word)
    for i, found in enumerate(heard):
        if _norm(found.word) == target and i > 0:
            boundary = (heard[i - 1].end + found.start) / 2
            return int(boundary * RATE), True
    share = sentence.index(word) / len(sentence)
    return int(share * audio.size), False


def labelled_set() -> list[Utterance]:
    out = []
    espeak, piper = list(ESPEAK), list(PIPER)
    for i, (sentence, word) in enumerate(SET):
        fragment_text = sentence[: sentence.index(f" {word} ") if f" {word} " in sentence else 0]
        for voice in (espeak[i % 2], piper[(i // 2) % 2]):
            say = ESPEAK.get(voice) or PIPER[voice]
            audio = say(sentence)
            out.append(Utterance(sentence, voice, True, audio, None, sentence, True))
            cut, found = cut_point(audio, sentence, word)
            out.append(
                Utterance(sentence, voice, False, audio[:cut], audio[cut:], fragment_text, found)
            )
    return out


async def hear(url: str, utterances: list[Utterance], gap_ms: int) -> list[dict[str, Any]]:
    rows = []
    async with StreamClient(url) as client:
        await client.silence(1.0)
        for utterance in utterances:
            turn = client.new_turn()
            await client.speak(utterance.first, RATE)
            if utterance.rest is not None:
                await client.speak(utterance.rest, RATE, lead_silence_ms=gap_ms)
            end = turn.last_speech_sent_at or 0.0
            timed_out = await _first_audio_then_cancel(client, turn)
            rows.append(_row(utterance, turn, end, timed_out))
            await client.silence(0.6)
    return rows


async def _first_audio_then_cancel(client: StreamClient, turn: Received) -> bool:
    """Stream silence until the agent's first audio, cancel it, wait for its end.

    True when the time ran out first (no audio, or no `response.done`)."""
    heard = await client.silence_while(lambda: turn.first_audio_at is None, timeout_s=15)
    await client.send({"type": "response.cancel"})
    try:
        await client.silence_until("response.done", 10)
    except TimeoutError:
        return True
    return not heard


def _row(utterance: Utterance, turn: Received, end: float, timed_out: bool) -> dict[str, Any]:
    def ms(at: float | None) -> float | None:
        return None if at is None else round((at - end) * 1000, 1)

    stopped = [t for t, e in turn.events if e.get("type") == "speech.stopped"]
    created = [t for t, e in turn.events if e.get("type") == "response.created"]
    finals = [e["text"] for _, e in turn.events if e.get("type") == "transcript.final"]
    cut_off = bool(created) and bool(stopped) and created[0] < stopped[-1]
    return {
        "sentence": utterance.sentence,
        "voice": utterance.voice,
        "complete": utterance.complete,
        "cut_found": utterance.cut_found,
        "fragment": None if utterance.complete else utterance.fragment_text,
        "transcripts": finals,
        "false_cut_off": None if utterance.complete else cut_off,
        "end_of_turn_ms": ms(stopped[-1] if stopped else None),
        "transcript_final_ms": ms(turn.time_of("transcript.final")),
        "response_created_ms": ms(created[-1] if created else None),
        "voice_to_voice_ms": ms(turn.first_audio_at),
        "timed_out": timed_out,
    }


def smart_turn_scores(utterances: list[Utterance]) -> list[dict[str, Any]]:
    """Smart Turn v3.2's probability on each utterance's first part (+200 ms silence)."""
    from services.gateway.smart_turn import shared_model

    model = shared_model(1)
    pad = np.zeros(RATE // 5, np.float32)
    clips = [np.concatenate([u.first, pad]) for u in utterances]
    scores = model.predict(clips)
    return [
        {"sentence": u.sentence, "voice": u.voice, "complete": u.complete, "p": round(p, 4)}
        for u, p in zip(utterances, scores, strict=True)
    ]


def tabulate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    complete = [r for r in rows if r["complete"]]
    incomplete = [r for r in rows if not r["complete"]]

    def values(key: str) -> list[float]:
        return [float(r[key]) for r in complete if r[key] is not None]

    eot, final, v2v = (
        values("end_of_turn_ms"),
        values("transcript_final_ms"),
        values("voice_to_voice_ms"),
    )
    cut = sum(1 for r in incomplete if r["false_cut_off"])
    return {
        "end_of_turn_ms": summary(eot) if eot else None,
        "transcript_final_ms": summary(final) if final else None,
        "voice_to_voice_ms": summary(v2v) if v2v else None,
        "breakdown_p50_ms": _breakdown(complete),
        "false_cut_offs": cut,
        "incomplete": len(incomplete),
        "false_cut_off_rate": round(cut / max(1, len(incomplete)), 3),
        "timed_out": sum(1 for r in rows if r["timed_out"]),
    }


def _breakdown(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """Median of each stage's share of voice-to-voice, from the client's clock."""

    def median(values: list[float]) -> float | None:
        return round(float(np.median(values)), 1) if values else None

    eot, asr, agent, audio = [], [], [], []
    for r in rows:
        marks = [r[k] for k in ("end_of_turn_ms", "transcript_final_ms", "response_created_ms")]
        if None in marks or r["voice_to_voice_ms"] is None:
            continue
        stop, final, created = marks
        eot.append(stop)
        asr.append(max(0.0, final - stop))
        agent.append(max(0.0, created - max(stop, final)))
        audio.append(r["voice_to_voice_ms"] - created)
    return {
        "end_of_turn": median(eot),
        "transcript_after_end_of_turn": median(asr),
        "to_response_created": median(agent),
        "response_to_first_audio": median(audio),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gap-ms", type=int, default=1000, help="pause inside incomplete turns")
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    utterances = labelled_set()
    order = np.random.default_rng(7).permutation(len(utterances))
    utterances = [utterances[i] for i in order]
    print(
        f"{len(utterances)} utterances; cuts found by word timestamps: "
        f"{sum(u.cut_found for u in utterances if not u.complete)}/{len(utterances) // 2}"
    )
    scores = smart_turn_scores(utterances)
    results: dict[str, Any] = {}
    for name in args.configs:
        with lite_stack(CONFIGS[name]) as urls:
            url = urls["gateway"].replace("http", "ws") + "/v1/stream"
            rows = asyncio.run(hear(url, utterances, args.gap_ms))
        results[name] = {"env": CONFIGS[name], "summary": tabulate(rows), "turns": rows}
        print(name, json.dumps(results[name]["summary"]), flush=True)
    result = {
        "benchmark": "turn_taking",
        "profile": "lite (faster-whisper tiny.en int8 + Piper joe + Silero VAD, echo agent)",
        "set": {
            "utterances": len(utterances),
            "complete": sum(u.complete for u in utterances),
            "incomplete": sum(not u.complete for u in utterances),
            "voices": [*ESPEAK, *PIPER],
            "gap_ms": args.gap_ms,
        },
        "smart_turn_scores": scores,
        "configs": results,
    }
    if args.out:
        write(args.out, result)


if __name__ == "__main__":
    main()
