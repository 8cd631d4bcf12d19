"""Turn-taking on labelled speech: how soon each end-of-turn policy answers, how often it
cuts a speaker off, and what that does to voice-to-voice latency.

    python -m benchmarks.turn_taking --out benchmarks/results/turn_taking_lite.json

The set, in two parts: a *tuning* part (twenty sentences — the first ten of 2026-11-25 and
ten more) and a *held-out* part (fourteen other sentences) on which no threshold or rule is
chosen. Each sentence is spoken whole (a *complete* turn) and cut where people stop (an
*incomplete* one: the speaker stops for `--gap-ms`, then says the rest): mid-phrase, in a
list ("Add eggs, milk, and"), between groups of digits or letters ("My number is five five
five,"), after a filler ("So, um,"), at a restart ("Set an alarm for, no,"), or where the
words so far look finished ("Turn the volume up"). Each in one espeak-ng voice and one
Piper voice, taken in turn from the part's voices: the tuning part's espeak-ng en-us 160
wpm and en-gb 190 wpm and Piper joe at speed 1.0 and 1.2; the held-out part's espeak-ng
en-gb-scotland 170 wpm and en-us 130 wpm and Piper joe at speed 1.0 and 0.85 (slower) —
80 + 56 utterances (`--part` picks one). Two more parts count the answers given at a
pause inside a sentence: `--part long`, sixteen long requests with commas, spoken whole,
and `--part "long held-out"`, twelve others in voices of their own (nothing is chosen on
them). The cut is made in the audio of the whole
sentence (at the quiet between two words nearest where the fragment, said alone, ends),
so the fragment keeps the unfinished prosody of speech that
goes on; the fragment synthesized as its own text would end like a sentence.

Per configuration, a fresh lite stack (faster-whisper tiny.en + Piper + echo agent, as
`voice-agent up` runs it) hears the whole set through /v1/stream in one session:

- complete turns: end-of-turn delay (the end of the voice → `speech.stopped`), the
  transcript's arrival, and voice-to-voice (→ first agent audio frame), all measured on
  the client from when the last voiced sample left (the clip's own trailing silence —
  about 150 ms in a Piper clip — counts as waiting, as it would for a person);
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
from pathlib import Path
from typing import Any

import httpx
import jiwer
import numpy as np

from benchmarks.stack import lite_stack
from benchmarks.voices import RATE, Audio, Voice, espeak, piper
from services.client.stream import Received, StreamClient
from services.common.audio.pcm import speech_end
from services.common.stats import summary
from services.gateway.turn_end import FILLERS
from services.loadtest.report import write
from services.loadtest.stats import words

# (sentence, the word the continuation starts with: the cut falls just before it, the
# kind of fragment the cut leaves)
SET: list[tuple[str, str, str]] = [
    ("What is the weather like in Paris today?", "Paris", "mid-phrase"),
    ("I would like to book a table for two people tonight.", "two", "mid-phrase"),
    ("Can you tell me, um, what time the museum opens?", "what", "filler"),
    ("Please remind me to call my sister tomorrow morning.", "call", "mid-phrase"),
    ("How long does it take to drive from Boston to New York?", "New", "mid-phrase"),
    ("I need a recipe for a quick vegetarian dinner.", "quick", "mid-phrase"),
    ("So, uh, I was wondering if you could help me with my order.", "I", "filler"),
    ("Could you play some relaxing music in the kitchen?", "relaxing", "mid-phrase"),
    ("My flight leaves at seven, and I need a taxi to the airport.", "I", "list"),
    ("What is the difference between a crocodile and an alligator?", "an", "mid-phrase"),
]
"""The first set (2026-11-25), on which the rules were first fitted: part of the tuning set."""

TUNING_MORE: list[tuple[str, str, str]] = [
    ("Add eggs, milk, and bread to my shopping list.", "bread", "list"),
    ("We need apples, bananas, oranges, and some grapes.", "oranges", "list"),
    ("My number is five five five, two one eight, four four zero nine.", "two", "number"),
    ("The confirmation code is B X seven four Q.", "seven", "number"),
    ("So, um, can you turn off the lights in the bedroom?", "can", "filler"),
    ("Set an alarm for, no, make that a timer for ten minutes.", "make", "restart"),
    ("Can you, uh, sorry, can you read me my last message?", "sorry", "restart"),
    ("Turn the volume up a little bit please.", "a", "looks whole"),
    ("I want to order a large pizza with mushrooms and olives.", "with", "looks whole"),
    ("Send a text to Maria saying I will be ten minutes late.", "saying", "looks whole"),
]
"""More ordinary requests, cut where people stop: in a list, between groups of digits or
letters, after a filler, at a restart, and where the words so far look finished."""

HELD_OUT: list[tuple[str, str, str]] = [
    ("Put butter, flour, sugar, and vanilla on the list.", "sugar", "list"),
    ("Remind me to buy coffee, tea, and a loaf of bread.", "and", "list"),
    ("Call me back at eight six seven, five three oh nine.", "five", "number"),
    ("My zip code is nine oh two one oh.", "one", "number"),
    ("The booking reference is K L M four two.", "four", "number"),
    ("Well, uh, I think I need a new password.", "I", "filler"),
    ("I would like to, um, change my delivery address.", "change", "filler"),
    ("Could you, I mean, would you check the traffic on my route?", "would", "restart"),
    ("Book a table at, actually, make it a delivery order instead.", "make", "restart"),
    ("What time does the pharmacy close on Sunday?", "close", "mid-phrase"),
    ("How do I get to the train station from here?", "from", "looks whole"),
    ("Tell me the news headlines for this morning.", "for", "looks whole"),
    ("Play the new album by my favourite band from Ireland.", "by", "looks whole"),
    ("Turn on the heating in the living room at six.", "in", "looks whole"),
]
"""The held-out part: sentences and (half of them) voices that no threshold or rule is
chosen on (docs/turn-taking.md)."""

LONG: list[str] = [
    "I need a flight to Denver on Friday, preferably in the morning, and a hotel near the "
    "convention center for three nights.",
    "When you get a chance, could you look up the hardware store, the one on Main Street, "
    "and tell me if it is open on Sunday?",
    "My daughter has a dentist appointment at four, so I will need to leave work early, "
    "probably around three thirty.",
    "If it rains tomorrow, move the picnic to Saturday, and let everyone on the list know "
    "by email.",
    "The package was supposed to arrive on Tuesday, but the tracking page still says it is "
    "in Chicago, which seems wrong.",
    "Read me the first three emails from my manager, skip the newsletters, and mark the "
    "rest as read.",
    "I am looking for a quiet restaurant, nothing too expensive, somewhere we can walk to "
    "from the theatre after the show.",
    "Before you book anything, check whether my passport is still valid, because I think it "
    "expires this spring.",
    "Set the thermostat to twenty one degrees, turn off the porch light, and lock the back "
    "door before midnight.",
    "Last time I ordered from them, the soup was cold, the bread was stale, and the driver "
    "was forty minutes late.",
    "Can you find a recipe that uses chicken, spinach, and rice, and takes less than half an "
    "hour to make?",
    "My brother is flying in from Toronto on the twelfth, so please add that to the "
    "calendar, with a reminder the day before.",
    "Play something calm, maybe piano or strings, but nothing with singing, while I finish "
    "this report.",
    "Tell my landlord that the heating in the bedroom is broken again, and ask when someone "
    "can come and fix it.",
    "I would like to cancel my gym membership, the one I signed up for in January, without "
    "paying the fee.",
    "Find me a train to Edinburgh that leaves after ten, arrives before four, and has a "
    "quiet carriage.",
]
"""Long requests, each a run of clauses with commas: the pauses inside a sentence that a
turn decision must not end at. None of them was used to choose a threshold or rule; they
are spoken whole (complete turns only), and an answer before the last word is a cut-off
inside the sentence (`complete_cut_inside`)."""
LONG_HELD_OUT: list[str] = [
    "Could you check my calendar for next week, especially Wednesday afternoon, and see if "
    "I have time for a haircut?",
    "When the electrician comes, let him in through the side gate, not the front, because "
    "the dog is in the hall.",
    "I left my umbrella on the bus this morning, the number nine, so could you find the "
    "lost property number?",
    "Order more printer paper, two boxes should do, and some blue pens for the office.",
    "My mother's birthday is on Sunday, so remind me on Friday, and again on Saturday "
    "evening, to buy flowers.",
    "If the meeting runs late, tell the babysitter I will be home by nine, not eight, and "
    "apologise for me.",
    "Find a hotel in Lisbon, close to the old town, with a pool if possible, for the last "
    "week of June.",
    "The car is making a strange noise, a sort of clicking, whenever I turn left, so book "
    "it in for a check.",
    "Write a short note to the neighbours, saying thanks for the cake, and that we would "
    "love to return the favour.",
    "I usually run in the evening, after work, but this week I want to try the mornings instead.",
    "Send the slides to Priya, the final version, not the draft, and copy in the rest of the team.",
    "What should I pack for a week in Iceland in October, if we plan to hike, and stay in cabins?",
]
"""The long part's held-out sentences, in voices of their own: nothing is chosen on them."""
LONG_HELD_OUT_ESPEAK: dict[str, Voice] = {
    "espeak en-gb-x-rp 160 wpm": espeak("en-gb-x-rp", 160),
    "espeak en-us 175 wpm": espeak("en-us", 175),
}
LONG_HELD_OUT_PIPER: dict[str, Voice] = {"piper joe 1.0": piper(1.0), "piper joe 0.8": piper(0.8)}
LONG_ESPEAK: dict[str, Voice] = {
    "espeak en-us 150 wpm": espeak("en-us", 150),
    "espeak en-gb-scotland 140 wpm": espeak("en-gb-scotland", 140),
}
LONG_PIPER: dict[str, Voice] = {"piper joe 1.1": piper(1.1), "piper joe 0.9": piper(0.9)}

PARTS = ("tuning", "held-out")
LONG_PARTS = ("long", "long held-out")

BEFORE = "before: silence 600 ms, no speculation, pads 200 ms, Piper 1 thread, 6-word piece"
CONFIGS: dict[str, dict[str, str]] = {
    BEFORE: {
        "VA_GATEWAY__END_OF_TURN": "silence",
        "VA_GATEWAY__SPECULATIVE_ASR": "false",
        "VA_VAD__PAUSE_MS": "200",
        "VA_VAD__TRAILING_PAD_MS": "200",
        "VA_TTS__PIPER__THREADS": "1",
        "VA_TTS__PIPER__FIRST_PIECE_WORDS": "6",
    },
    "silence 600 ms": {"VA_GATEWAY__END_OF_TURN": "silence"},
    "heuristic": {"VA_GATEWAY__END_OF_TURN": "heuristic"},
    "smart-turn": {"VA_GATEWAY__END_OF_TURN": "smart-turn"},
    "smart-turn, unsure 500 ms": {
        "VA_GATEWAY__END_OF_TURN": "smart-turn",
        "VA_GATEWAY__END_OF_TURN_UNSURE_MS": "500",
    },
    "smart-turn, unsure 700 ms": {
        "VA_GATEWAY__END_OF_TURN": "smart-turn",
        "VA_GATEWAY__END_OF_TURN_UNSURE_MS": "700",
    },
    "smart-turn, speculation at 64 ms": {
        "VA_GATEWAY__END_OF_TURN": "smart-turn",
        "VA_VAD__PAUSE_MS": "64",
        "VA_VAD__TRAILING_PAD_MS": "64",
    },
    # 64 ms is the default since (the row above equals "smart-turn"): the comparison again
    "smart-turn, pause 100 ms (before)": {
        "VA_GATEWAY__END_OF_TURN": "smart-turn",
        "VA_VAD__PAUSE_MS": "100",
        "VA_VAD__TRAILING_PAD_MS": "100",
    },
    # before the least silence (VA_GATEWAY__END_OF_TURN_MIN_SILENCE_MS): a turn ended as
    # soon as the model and the words agreed, so a faster ASR ended turns sooner
    "smart-turn, no least silence": {
        "VA_GATEWAY__END_OF_TURN": "smart-turn",
        "VA_GATEWAY__END_OF_TURN_MIN_SILENCE_MS": "0",
    },
    # one thread is the default since these were recorded (when it was CTranslate2's own)
    "smart-turn, ASR CTranslate2's threads (before)": {
        "VA_GATEWAY__END_OF_TURN": "smart-turn",
        "VA_ASR__WHISPER__CPU_THREADS": "0",
    },
    "smart-turn, ASR one thread": {
        "VA_GATEWAY__END_OF_TURN": "smart-turn",
        "VA_ASR__WHISPER__CPU_THREADS": "1",
    },
    "smart-turn, ASR one thread, no least silence": {
        "VA_GATEWAY__END_OF_TURN": "smart-turn",
        "VA_ASR__WHISPER__CPU_THREADS": "1",
        "VA_GATEWAY__END_OF_TURN_MIN_SILENCE_MS": "0",
    },
    "smart-turn, previous defaults (ASR doubt, no-new-words, unsure 500 ms)": {
        "VA_GATEWAY__END_OF_TURN": "smart-turn",
        "VA_GATEWAY__END_OF_TURN_TRANSCRIPT_LOGPROB": "-0.5",
        "VA_GATEWAY__END_OF_TURN_LAST_WORD_LOGPROB": "-0.6",
        "VA_GATEWAY__END_OF_TURN_NO_NEW_WORDS": "true",
        "VA_GATEWAY__END_OF_TURN_UNSURE_MS": "500",
    },
}
"""Each against the defaults (pause 64 ms, trailing pad 64 ms, smart-turn first asked
at 100 ms of silence and again every 200 ms, unsure 300 ms, the ASR's doubt and the no-new-words
rule off, Piper 2 threads with a 4-word first piece); `before` is how the stack ran before
this benchmark drove those changes."""


ESPEAK: dict[str, Voice] = {
    "espeak en-us 160 wpm": espeak("en-us", 160),
    "espeak en-gb 190 wpm": espeak("en-gb", 190),
}
Transcribe = Callable[[list[Audio]], list[str]]

PIPER: dict[str, Voice] = {"piper joe 1.0": piper(1.0), "piper joe 1.2": piper(1.2)}

HELD_OUT_ESPEAK: dict[str, Voice] = {
    "espeak en-gb-scotland 170 wpm": espeak("en-gb-scotland", 170),
    "espeak en-us 130 wpm": espeak("en-us", 130),
}
HELD_OUT_PIPER: dict[str, Voice] = {"piper joe 1.0": piper(1.0), "piper joe 0.85": piper(0.85)}
"""The held-out part's voices: three of the four are heard only there (a Scottish accent,
a slow en-us, a slower Piper)."""


@dataclass
class Utterance:
    sentence: str
    voice: str
    complete: bool
    first: Audio  # the whole sentence, or the fragment before the pause
    rest: Audio | None  # the continuation after the pause (incomplete only)
    fragment_text: str
    cut_heard: tuple[str, str] | None = None  # what the ASR hears on each side of the cut
    part: str = "tuning"  # or "held-out"
    kind: str = "mid-phrase"  # the fragment's kind (its sentence's, for a whole one)


def _quiet_points(audio: Audio, estimate: int) -> list[int]:
    """Candidate cuts: the quietest 10 ms of each 40 ms step from 250 ms before to 150 ms
    after `estimate` (the gaps between words fall among them)."""
    hop = RATE // 100
    lo = max(hop, estimate - RATE // 4)
    hi = min(audio.size - hop, estimate + RATE * 15 // 100)
    points = []
    for start in range(lo, hi, 4 * hop):
        window = range(start, min(hi, start + 4 * hop), hop // 2)
        energy = [float(np.sqrt(np.mean(audio[i : i + hop] ** 2))) for i in window]
        if energy:
            points.append(window[int(np.argmin(energy))] + hop // 2)
    return points or [estimate]


def cut_point(
    audio: Audio, fragment: Audio, sentence: str, fragment_text: str, transcribe: Transcribe
) -> tuple[int, tuple[str, str]]:
    """Where the fragment's words end inside the whole sentence's audio.

    The fragment said alone lasts about as long as the same words inside the sentence;
    among the quiet points near that estimate, the cut is the one where the ASR hears the
    fragment's words before it and the rest of the sentence after it (fewest word errors
    in both, fillers aside; then the quietest point, the gap between the words rather
    than a stop inside the next one). A cut one word early or late would mislabel the
    utterance ("...remind me to call" or "...weather like" can be whole sentences), and
    a cut inside the next word leaves its onset in the fragment ("...play some re-")."""
    estimate = speech_end(fragment)
    points = _quiet_points(audio, estimate)
    heard = transcribe([audio[:point] for point in points] + [audio[point:] for point in points])
    before, after = heard[: len(points)], heard[len(points) :]
    rest_text = sentence[len(fragment_text) :]

    def errors(expected: str, text: str) -> int:
        want = " ".join(w for w in words(expected).split() if w not in FILLERS)
        said = " ".join(w for w in words(text).split() if w not in FILLERS)
        out = jiwer.process_words(want, said)
        return int(out.substitutions + out.deletions + out.insertions)

    hop = RATE // 100

    def loudness(point: int) -> float:
        return float(np.sqrt(np.mean(audio[point - hop // 2 : point + hop // 2] ** 2)))

    ranked = sorted(
        zip(points, before, after, strict=True),
        key=lambda row: (
            errors(fragment_text, row[1]) + errors(rest_text, row[2]),
            loudness(row[0]),
        ),
    )
    point, heard_before, heard_after = ranked[0]
    return point, (heard_before, heard_after)


def asr_transcriber() -> Transcribe:
    """The lite profile's ASR (tiny.en), each clip followed by 100 ms of silence (as the
    gateway's trailing pad)."""
    from services.asr.engines.base import AsrInput
    from services.asr.engines.whisper import FasterWhisperEngine
    from services.asr.settings import WhisperSettings

    engine = FasterWhisperEngine(WhisperSettings(model="tiny.en"))
    engine.load()
    pad = np.zeros(RATE // 10, np.float32)

    def transcribe(clips: list[Audio]) -> list[str]:
        items = [AsrInput(audio=np.concatenate([clip, pad])) for clip in clips]
        return [t.text for t in engine.transcribe_batch(items)]

    return transcribe


def labelled_set(transcribe: Transcribe | None = None, part: str = "all") -> list[Utterance]:
    """The labelled utterances of `part` ("tuning", "held-out" or "all"): each sentence
    whole and cut, in one espeak-ng voice and one Piper voice taken in turn from the
    part's voices. The split is fixed: the tuning part is `SET` + `TUNING_MORE` in the
    tuning voices, the held-out part `HELD_OUT` in its own voices."""
    transcribe = transcribe or asr_transcriber()
    parts = {
        "tuning": (SET + TUNING_MORE, ESPEAK, PIPER),
        "held-out": (HELD_OUT, HELD_OUT_ESPEAK, HELD_OUT_PIPER),
    }
    out = []
    for name in PARTS if part == "all" else (part,):
        sentences, espeaks, pipers = parts[name]
        espeak, piper = list(espeaks), list(pipers)
        for i, (sentence, word, kind) in enumerate(sentences):
            found = re.search(rf" {re.escape(word)}\b", sentence)
            if found is None:
                raise ValueError(f"no {word!r} in {sentence!r}")
            fragment_text = sentence[: found.start()]
            for voice in (espeak[i % 2], piper[(i // 2) % 2]):
                say = espeaks.get(voice) or pipers[voice]
                audio = say(sentence)
                out.append(
                    Utterance(sentence, voice, True, audio, None, sentence, None, name, kind)
                )
                fragment = say(fragment_text)
                cut, heard = cut_point(audio, fragment, sentence, fragment_text, transcribe)
                first, rest = audio[:cut], audio[cut:]
                out.append(
                    Utterance(sentence, voice, False, first, rest, fragment_text, heard, name, kind)
                )
    return out


def long_set(part: str = "long") -> list[Utterance]:
    """`LONG` (part "long") or `LONG_HELD_OUT` ("long held-out"), each sentence whole in
    one espeak-ng voice and one Piper voice of its part, in turn."""
    sentences, espeaks, pipers = {
        "long": (LONG, LONG_ESPEAK, LONG_PIPER),
        "long held-out": (LONG_HELD_OUT, LONG_HELD_OUT_ESPEAK, LONG_HELD_OUT_PIPER),
    }[part]
    espeak, piper = list(espeaks), list(pipers)
    out = []
    for i, sentence in enumerate(sentences):
        for voice in (espeak[i % 2], piper[(i // 2) % 2]):
            say = espeaks.get(voice) or pipers[voice]
            out.append(
                Utterance(sentence, voice, True, say(sentence), None, sentence, None, part, "long")
            )
    return out


async def hear(
    url: str, utterances: list[Utterance], gap_ms: int, metrics_url: str | None = None
) -> list[dict[str, Any]]:
    """Each utterance's row; with `metrics_url` (the gateway's /metrics), also the turn
    model's decisions taken while it was heard (`decisions`: which rule ended a turn)."""
    rows = []
    audio_at: list[float] = []
    async with StreamClient(url) as client, httpx.AsyncClient(timeout=10) as http:

        async def decisions() -> dict[str, float]:
            if metrics_url is None:
                return {}
            return _turn_model_counts((await http.get(metrics_url)).text)

        before = await decisions()
        client.on_message = lambda now, message: (
            audio_at.append(now) if isinstance(message, bytes) else None
        )
        await client.silence(1.0)
        for utterance in utterances:
            turn = client.new_turn()
            audio_at.clear()
            await client.speak(utterance.first, RATE)
            if utterance.rest is not None:
                await client.speak(utterance.rest, RATE, lead_silence_ms=gap_ms)
            end = turn.last_speech_sent_at or 0.0  # the end of the voice, not of the clip
            answer = await _answer_then_cancel(client, turn, end, audio_at)
            await client.silence(0.6)
            row = _row(utterance, turn, end, answer, audio_at)
            if metrics_url is not None:
                after = await decisions()
                change = {k: v - before.get(k, 0.0) for k, v in after.items()}
                row["decisions"] = {k: d for k, d in change.items() if d}
                before = after
            rows.append(row)
    return rows


def _turn_model_counts(metrics: str) -> dict[str, float]:
    """`va_gateway_turn_model_total` by decision, from a /metrics text."""
    return _counters(metrics, {"va_gateway_turn_model": "turn_model"})["turn_model"]


def _counters(metrics: str, names: dict[str, str]) -> dict[str, dict[str, float]]:
    """The counters of `names` (metric family → key) in a /metrics text, by their
    `outcome` or `decision` label ("" when they have neither)."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, dict[str, float]] = {key: {} for key in names.values()}
    for family in text_string_to_metric_families(metrics):
        key = names.get(family.name)
        if key is None:
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                label = sample.labels.get("outcome") or sample.labels.get("decision", "")
                found[key][label] = sample.value
    return found


def _answer(turn: Received, end: float, audio_at: list[float]) -> tuple[float, str] | None:
    """The response to the whole utterance (created after its last speech frame) once its
    first audio is here: (when it was created, its id)."""
    for at, response_id in turn.responses_created(end):
        if any(t >= at for t in audio_at):
            return at, response_id
    return None


async def _answer_then_cancel(
    client: StreamClient, turn: Received, end: float, audio_at: list[float]
) -> str | None:
    """Stream silence until the answer's first audio, cancel the answer, wait for its end.

    The answer's id, or None when none came in time."""
    await client.silence_while(lambda: _answer(turn, end, audio_at) is None, timeout_s=15)
    answer = _answer(turn, end, audio_at)
    await client.send({"type": "response.cancel"})
    if answer is None:
        return None
    await client.silence_until(
        "response.done", 10, predicate=lambda e: e.get("response_id") == answer[1]
    )
    return answer[1]


def _row(
    utterance: Utterance,
    turn: Received,
    end: float,
    answer: str | None,
    audio_at: list[float],
) -> dict[str, Any]:
    def ms(at: float | None) -> float | None:
        return None if at is None else round((at - end) * 1000, 1)

    def times(kind: str) -> list[float]:
        return [t for t, e in turn.events if e.get("type") == kind]

    stopped, created, finals = (
        times("speech.stopped"),
        times("response.created"),
        times("transcript.final"),
    )
    answered_at = next(
        (t for t, e in turn.events if e.get("response_id") == answer and t in created), None
    )
    first_audio = (
        None if answered_at is None else next((t for t in audio_at if t >= answered_at), None)
    )
    # an answer begun before the user's last words (a continuation lost after the
    # cut-off, with no turn of its own, still counts); in a whole sentence, an answer at
    # a pause inside it ("My flight leaves at seven, | and...")
    cut_off = bool(created) and created[0] < end
    return {
        "sentence": utterance.sentence,
        "voice": utterance.voice,
        "complete": utterance.complete,
        "fragment": None if utterance.complete else utterance.fragment_text,
        "cut_heard": utterance.cut_heard,
        "transcripts": [e["text"] for _, e in turn.events if e.get("type") == "transcript.final"],
        "false_cut_off": cut_off,
        "responses": len(created),
        "end_of_turn_ms": ms(stopped[-1] if stopped else None),
        "transcript_final_ms": ms(finals[-1] if finals else None),
        "response_created_ms": ms(answered_at),
        "voice_to_voice_ms": ms(first_audio),
        "timed_out": answer is None,
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


def gateway_counters(base_url: str) -> dict[str, Any]:
    """The gateway's speculation, turn-model and cut-off counters, from its /metrics."""
    names = {
        "va_gateway_speculative_asr": "speculative_asr",
        "va_gateway_turn_model": "turn_model",
        "va_gateway_cut_offs_joined": "cut_offs_joined",
    }
    found = _counters(httpx.get(f"{base_url}/metrics", timeout=10).text, names)
    speculations = sum(found["speculative_asr"].values())
    wasted = found["speculative_asr"].get("wasted", 0.0)
    return {
        **found,
        "speculation_wasted_rate": round(wasted / speculations, 3) if speculations else None,
    }


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
    cut_whole = sum(1 for r in complete if r["false_cut_off"])
    heard = [(words(r["sentence"]), words(" ".join(r["transcripts"]))) for r in complete]
    return {
        "transcript_wer": round(
            float(jiwer.wer([said for said, _ in heard], [got for _, got in heard])), 4
        ),
        "end_of_turn_ms": summary(eot) if eot else None,
        "transcript_final_ms": summary(final) if final else None,
        "voice_to_voice_ms": summary(v2v) if v2v else None,
        "breakdown_p50_ms": _breakdown(complete),
        "false_cut_offs": cut,
        "incomplete": len(incomplete),
        "false_cut_off_rate": round(cut / max(1, len(incomplete)), 3),
        "complete_cut_inside": cut_whole,
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
    parser.add_argument("--part", default="all", choices=["all", *PARTS, *LONG_PARTS])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    long = args.part in LONG_PARTS
    utterances = long_set(args.part) if long else labelled_set(part=args.part)
    order = np.random.default_rng(7).permutation(len(utterances))
    utterances = [utterances[i] for i in order]
    print(f"{len(utterances)} utterances")
    scores = smart_turn_scores(utterances)
    results: dict[str, Any] = {}
    for name in args.configs:
        with lite_stack(CONFIGS[name]) as urls:
            url = urls["gateway"].replace("http", "ws") + "/v1/stream"
            rows = asyncio.run(hear(url, utterances, args.gap_ms, f"{urls['gateway']}/metrics"))
            counters = gateway_counters(urls["gateway"])
        results[name] = {
            "env": CONFIGS[name],
            "summary": {**tabulate(rows), **counters},
            "turns": rows,
        }
        print(name, json.dumps(results[name]["summary"]), flush=True)
    result = {
        "benchmark": "turn_taking",
        "profile": "lite (faster-whisper tiny.en int8 + Piper joe + Silero VAD, echo agent)",
        "set": {
            "utterances": len(utterances),
            "complete": sum(u.complete for u in utterances),
            "incomplete": sum(not u.complete for u in utterances),
            "part": args.part,
            "voices": sorted({u.voice for u in utterances}),
            "gap_ms": args.gap_ms,
        },
        "smart_turn_scores": scores,
        "configs": results,
    }
    if args.out:
        write(args.out, result)


if __name__ == "__main__":
    main()
