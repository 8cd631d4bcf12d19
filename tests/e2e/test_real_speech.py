"""Real speech through the default profile: Whisper tiny.en hears it, Piper's reply is clear.

Twelve requests, each spoken by espeak-ng and by the Piper voice, go through `/v1/stream`
of the lite stack (faster-whisper tiny.en + Piper, the weights of `make run`). The
transcripts' word error rate over the set must stay at or below 0.15; the echo agent's
spoken replies, transcribed again, must give back at least 0.85 of their words. And no
session's transcript holds words that only another session said (sessions run six at a
time, through one batched VAD and one batched Whisper).
"""

from __future__ import annotations

import asyncio

import jiwer
import numpy as np
import numpy.typing as npt
import pytest

from services.client.stream import StreamClient
from services.common.audio.pcm import pcm16_to_float
from services.loadtest.corpus import SENTENCES as CORPUS
from services.loadtest.stats import words
from tests.conftest import Stack
from tests.speech import piper_speech, speak, transcribed

SENTENCES = CORPUS[:12]
MAX_WER = 0.15
MIN_REPLY_RECALL = 0.85
AT_ONCE = 6
"""Sessions talking at the same time (the stack shares this machine's two cores)."""
COMMON = frozenset({"a", "the", "to", "me", "is", "it", "you", "for", "and", "i", "in", "do"})
"""Words too common to say which sentence a transcript's word came from."""


def spoken(text: str, voice: str) -> npt.NDArray[np.float32]:
    """`text` as 16 kHz speech: espeak-ng's en-us, or the Piper voice."""
    if voice == "espeak":
        return speak(text, 16000)
    return piper_speech(text)


async def _turn(
    url: str, audio: npt.NDArray[np.float32], gate: asyncio.Semaphore
) -> tuple[str, bytes]:
    async with gate, StreamClient(url) as client:
        turn = client.new_turn()
        await client.speak(audio, 16000)
        await client.silence_until("response.done", timeout_s=60)
    finals = turn.of_type("transcript.final")
    assert len(finals) == 1, turn.events
    return str(finals[0]["text"]), bytes(turn.audio)


@pytest.fixture(scope="module")
def heard(lite_stack: Stack) -> dict[tuple[str, str], tuple[str, bytes]]:
    """(voice, sentence) → (the transcript, the agent's spoken reply)."""
    cases = [(voice, s) for voice in ("espeak", "piper") for s in SENTENCES]

    async def run() -> list[tuple[str, bytes]]:
        gate = asyncio.Semaphore(AT_ONCE)
        return await asyncio.gather(
            *(_turn(lite_stack.stream_url, spoken(s, voice), gate) for voice, s in cases)
        )

    return dict(zip(cases, asyncio.run(run()), strict=True))


@pytest.mark.parametrize("voice", ["espeak", "piper"])
def test_transcripts_word_error_rate(
    heard: dict[tuple[str, str], tuple[str, bytes]], voice: str
) -> None:
    references = [words(s) for s in SENTENCES]
    hypotheses = [words(heard[(voice, s)][0]) for s in SENTENCES]
    error_rate = float(jiwer.wer(references, hypotheses))
    wrong = [(r, h) for r, h in zip(references, hypotheses, strict=True) if r != h]
    assert error_rate <= MAX_WER, (error_rate, wrong)


def others_heard(transcript: str, own: str, others: list[str]) -> list[str]:
    """The other sentences of which the transcript holds two or more words (not common
    ones) that its own sentence does not have: words only another session said."""
    foreign = set(words(transcript).split()) - set(words(own).split()) - COMMON
    return [other for other in others if len(foreign & set(words(other).split())) >= 2]


def test_others_heard_names_the_sentence_a_transcript_borrowed_from() -> None:
    own, other = "set a timer for ten minutes", "read me the news headlines"
    leaked = "Set a timer for ten minutes, read me the new headlines."
    assert others_heard(leaked, own, [other, "is it going to rain today"]) == [other]
    misheard = "Set the timer for two minutes."
    assert others_heard(misheard, own, [other, "is it going to rain today"]) == []


def test_no_session_hears_another(heard: dict[tuple[str, str], tuple[str, bytes]]) -> None:
    """The set was once seen failing its word error rate with "read me the new headlines"
    four times over in the transcript of "set a timer for ten minutes", spoken at the same
    time by another session (undiagnosed; not seen again in 768 sessions). This names
    such a transcript, and the sentence it borrowed from, whenever it happens."""
    borrowed = {
        (voice, sentence): (text, others)
        for (voice, sentence), (text, _) in heard.items()
        if (others := others_heard(text, sentence, [s for s in SENTENCES if s != sentence]))
    }
    assert not borrowed, borrowed


def test_the_spoken_replies_are_intelligible(
    lite_stack: Stack, heard: dict[tuple[str, str], tuple[str, bytes]]
) -> None:
    said, recovered = [], []
    for text, audio in heard.values():
        reply = pcm16_to_float(audio)
        assert reply.size > 0.3 * 24000, text
        said.append(words(text))
        recovered.append(words(transcribed(lite_stack.asr.http, reply, 24000)))
    output = jiwer.process_words(said, recovered)
    recall = output.hits / (output.hits + output.substitutions + output.deletions)
    assert recall >= MIN_REPLY_RECALL, list(zip(said, recovered, strict=True))
