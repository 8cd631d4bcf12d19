"""End-of-turn policies: has the user finished, or only paused?

Two kinds of policy:
- transcript policies (`silence`, `heuristic`) act after the VAD's silence
  (`VA_VAD__MIN_SILENCE_MS`) and the transcript: they return how long to wait for more
  speech first (0 answers at once); if the user speaks again inside the hold, the
  gateway joins both utterances into one user turn and asks again;
- pause policies (`smart-turn`) are asked at each pause (`VA_VAD__PAUSE_MS`, 64 ms of
  silence, or `end_of_turn_first_ask_ms` if later) with the utterance's audio, the
  silence so far and, when it comes,
  the speculative transcript of the same audio: complete ends the turn at once;
  incomplete waits, asking again every `end_of_turn_recheck_ms` of further silence,
  until `end_of_turn_fallback_ms` of silence ends the turn anyway.

`smart-turn` joins the audio model and the words of the transcript:
- the transcript ends mid-thought ("...a table for", "...and", "um", "to...") → wait, up
  to `end_of_turn_fallback_ms` (the model alone called half such fragments complete);
- otherwise the model says complete → end now;
- the model hears more to come but the words do not ("So I was wondering if you could
  help me with my order.", p = 0.02) → end at `end_of_turn_unsure_ms` of silence.
Off by default, each for a reason measured on the held-out part of the labelled set
(docs/turn-taking.md): the speech since the utterance's previous pause added no words
(`end_of_turn_no_new_words`: "Can you tell me, um," heard as "Can you tell me?" twice) →
wait for the fallback; the ASR doubts the words (`end_of_turn_transcript_logprob`,
`end_of_turn_last_word_logprob`) → end at `end_of_turn_doubt_ms` of silence.
Measured on labelled speech in benchmarks/turn_decisions.py. Waiting for the transcript
costs nothing on the way to the answer, which needs it anyway.

`auto` (the default) is `smart-turn` where its model is installed (the `smart-turn`
extra), else `silence`. A model of your own plugs in as `package.module:factory` in
`VA_GATEWAY__END_OF_TURN` (the factory gets the gateway settings), or in `POLICIES`.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from services.common.audio.pcm import AudioF32
from services.common.audio.vad import VadSettings
from services.gateway import metrics
from services.gateway.agent import Turn
from services.gateway.settings import END_OF_TURN_POLICIES, GatewaySection

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from services.gateway.smart_turn import SmartTurnBatcher


@dataclass(frozen=True, slots=True)
class Heard:
    """A speculative transcript: its text, and how sure the ASR is of its last word."""

    text: str
    last_word_logprob: float | None = None
    """Log-probability of the last word (None: the ASR does not say)."""
    before: str | None = None
    """The transcript of the same utterance at its previous pause (None: none known)."""
    avg_logprob: float | None = None
    """Mean log-probability of the text's tokens (None: the ASR does not say)."""
    language: str | None = None
    """The language the ASR heard (None: it does not say)."""

    def added_no_words(self) -> bool:
        """Whether the speech since the previous pause added no words, fillers aside: it was
        a filler or a word the ASR left out ("Can you tell me, um," heard as "Can you tell
        me?" at both pauses; "...at seven, and" as "...at 7." twice)."""
        if self.before is None:
            return False
        return spoken_words(self.text) == spoken_words(self.before)

    def doubted(self, mean: float | None, last_word: float | None) -> bool:
        """Whether the ASR scores the text below `mean` (its tokens' mean log-probability)
        or its last word below `last_word`; a threshold or score that is None is no doubt."""
        return _below(self.avg_logprob, mean) or _below(self.last_word_logprob, last_word)


WORD_RULE_LANGUAGES = frozenset({"en"})
"""The languages whose words the rules below know (trailing words, fillers)."""


def word_rules_apply(language: str | None) -> bool:
    """Whether the word rules (`ends_mid_thought`, fillers) may judge a transcript in
    `language`: English, or a language nobody named (an English-only ASR)."""
    return language is None or language.lower().split("-")[0] in WORD_RULE_LANGUAGES


def _below(score: float | None, threshold: float | None) -> bool:
    return score is not None and threshold is not None and score < threshold


Transcript = asyncio.Future[Heard | None]
"""The speculative transcript of the pause being decided: done once it is known (None: none
will come). A policy may read it at once when it is done, or await it (shielded: it is the
session's, and other asks of the same pause share it)."""


class EndOfTurn(Protocol):
    """Decides whether the user's turn is over."""

    name: str
    decides_at_pause: bool
    """True: `turn_complete` is asked at pauses and the VAD's silence is only a fallback."""

    def load(self) -> None:
        """Load what the policy needs (blocking; the gateway runs it at start-up)."""

    async def turn_complete(
        self, audio: AudioF32, transcript: Transcript, silence_ms: int = 0
    ) -> bool:
        """At a pause: whether the utterance so far (16 kHz), followed by `silence_ms` of
        silence, ends the turn. `transcript` is its speculative transcript, a future done
        once the text is known (None: there will be none)."""
        ...

    async def hold_ms(self, history: list[Turn], transcript: str) -> int:
        """After the transcript: milliseconds to wait for more speech (0: answer now).

        `history` ends with the user turn `transcript` belongs to.
        """
        ...


class SilenceOnly:
    """VAD silence alone ends the turn."""

    name = "silence"
    decides_at_pause = False

    def __init__(self, settings: GatewaySection) -> None:
        del settings

    def load(self) -> None:
        """Nothing to load."""

    async def turn_complete(
        self, audio: AudioF32, transcript: Transcript, silence_ms: int = 0
    ) -> bool:
        return False

    async def hold_ms(self, history: list[Turn], transcript: str) -> int:
        return 0


_WORD = re.compile(r"[a-z0-9']+")

FILLERS = frozenset(_WORD.findall("um uh er erm hmm mm ah"))
"""Hesitations, which the ASR writes one time and leaves out the next."""

TRAILING_WORDS = FILLERS | frozenset(
    _WORD.findall(
        "and but or so because if then that which who when while although like the a an to "
        "of for with my your our their about than as in on at from by into onto i we they "
        "he she some every each"
    )
)
"""Words a finished sentence rarely ends with: a pause after them is a pause mid-thought."""

OPEN_ENDINGS = ("...", "…", "-", ",", ";", ":")
"""How a transcript ends when the speaker trailed off (Whisper writes "to..." and "in-")."""


class TrailingWordHeuristic(SilenceOnly):
    """Holds on when the transcript ends in a conjunction, article, preposition or filler."""

    name = "heuristic"

    def __init__(self, settings: GatewaySection) -> None:
        self.hold = settings.end_of_turn_hold_ms

    async def hold_ms(self, history: list[Turn], transcript: str) -> int:
        return self.hold if ends_mid_thought(transcript) else 0


def spoken_words(text: str) -> list[str]:
    """A transcript's words, lowercased, without punctuation or fillers."""
    return [word for word in _WORD.findall(text.lower()) if word not in FILLERS]


def ends_mid_thought(text: str | None) -> bool:
    """Whether a transcript ends in a word a finished sentence rarely ends with, or trails
    off ("Please remind me to...", "in-", "um,"); no transcript (None) does not."""
    words = _WORD.findall(text.lower()) if text else []
    if not text or not words:
        return False
    return words[-1] in TRAILING_WORDS or text.rstrip().endswith(OPEN_ENDINGS)


def only_trails_off(text: str | None) -> bool:
    """Whether a transcript that ends mid-thought does so by its punctuation alone ("Read me
    the new head, I'll..."), not by a word a finished sentence rarely ends with."""
    words = _WORD.findall(text.lower()) if text else []
    return bool(words) and words[-1] not in TRAILING_WORDS and ends_mid_thought(text)


class SmartTurn(SilenceOnly):
    """Smart Turn v3.2 on the utterance's audio at each pause (services/gateway/smart_turn.py)."""

    name = "smart-turn"
    decides_at_pause = True
    mid_thought_rule = True
    """Words that end mid-thought wait for the fallback (benchmarks turn this off to
    measure what it is worth)."""
    trailing_off_asks_model = False
    """A transcript that ends mid-thought by its punctuation alone ("...", "-", ",") waits
    only when the model also calls the turn incomplete. Off: on the held-out part of the
    labelled set it answered 94 fragments of 112 early against 87, and no complete turn
    sooner (docs/turn-taking.md); benchmarks turn it on to measure it."""

    def __init__(self, settings: GatewaySection) -> None:
        self.threshold = settings.smart_turn_threshold
        self.threads = settings.smart_turn_threads
        self.models_dir = settings.models_dir
        self.unsure_ms = settings.end_of_turn_unsure_ms
        self.doubt_ms = settings.end_of_turn_doubt_ms
        self.transcript_logprob = settings.end_of_turn_transcript_logprob
        self.last_word_logprob = settings.end_of_turn_last_word_logprob
        self.no_new_words_rule = settings.end_of_turn_no_new_words
        self.batcher: SmartTurnBatcher | None = None

    def load(self) -> None:
        """The model (once per process); EngineUnavailable naming the install if missing."""
        from services.gateway.smart_turn import SmartTurnBatcher, shared_model

        self.batcher = SmartTurnBatcher(shared_model(self.threads, self.models_dir))

    async def turn_complete(
        self, audio: AudioF32, transcript: Transcript, silence_ms: int = 0
    ) -> bool:
        if self.batcher is None:
            raise RuntimeError("smart-turn: load() was not called")
        if transcript.done():
            decided = self._by_words(transcript.result(), silence_ms)
            if decided is not None:  # the model's answer cannot change it: not asked
                return decided
        probability = await self.batcher.probability(audio)
        log.debug("turn model: p=%.3f after %d ms of silence", probability, silence_ms)
        heard = await asyncio.shield(transcript)
        decided = self._by_words(heard, silence_ms)
        if decided is not None:
            return decided
        if probability >= self.threshold:
            metrics.TURN_MODEL.labels("complete").inc()
            return True
        if heard is not None and self._model_judges_trailing_off(heard):
            metrics.TURN_MODEL.labels("incomplete_words").inc()
            return False
        return self._waited(silence_ms, self.unsure_ms, "incomplete", "unsure_ended")

    def _model_judges_trailing_off(self, heard: Heard) -> bool:
        """Whether `heard` ends mid-thought by punctuation alone and the model is to judge it."""
        return (
            self.mid_thought_rule
            and self.trailing_off_asks_model
            and word_rules_apply(heard.language)
            and only_trails_off(heard.text)
        )

    def _by_words(self, heard: Heard | None, silence_ms: int) -> bool | None:
        """The decision the transcript alone makes, whatever the model says (None: the
        model decides): words that end mid-thought and speech since the previous pause
        that added no words wait for the fallback; words the ASR doubts, for the doubt
        wait; other words end the turn once the unsure wait has passed."""
        if heard is None:
            return None
        words_known = word_rules_apply(heard.language)
        trailing_off = self._model_judges_trailing_off(heard)
        mid_thought = self.mid_thought_rule and words_known and ends_mid_thought(heard.text)
        if mid_thought and not trailing_off:
            metrics.TURN_MODEL.labels("incomplete_words").inc()
            return False
        if self.no_new_words_rule and words_known and heard.added_no_words():
            metrics.TURN_MODEL.labels("no_new_words").inc()
            return False
        if heard.doubted(self.transcript_logprob, self.last_word_logprob):
            return self._waited(silence_ms, self.doubt_ms, "doubted_words", "doubt_ended")
        if trailing_off:
            return None  # complete if the model says so; else it waits (turn_complete)
        if silence_ms >= self.unsure_ms:  # complete whatever the model says: not asked
            metrics.TURN_MODEL.labels("unsure_ended").inc()
            return True
        return None

    def _waited(self, silence_ms: int, wait_ms: int, waiting: str, ended: str) -> bool:
        """Whether `wait_ms` of silence has passed, counted as `ended` or `waiting`."""
        done = silence_ms >= wait_ms
        metrics.TURN_MODEL.labels(ended if done else waiting).inc()
        return done


def listening(policy: EndOfTurn, vad: VadSettings, settings: GatewaySection) -> VadSettings:
    """The VAD settings a session hears with: under a pause policy the VAD's silence only
    ends a turn the policy keeps calling incomplete (`end_of_turn_fallback_ms`)."""
    if not policy.decides_at_pause:
        return vad
    return vad.model_copy(update={"min_silence_ms": settings.end_of_turn_fallback_ms})


Factory = Callable[[GatewaySection], EndOfTurn]

POLICIES: dict[str, Factory] = {
    "silence": SilenceOnly,
    "heuristic": TrailingWordHeuristic,
    "smart-turn": SmartTurn,
}


def create_policy(settings: GatewaySection) -> EndOfTurn:
    """The policy `settings.end_of_turn` names: `auto`, a registered name or `module:factory`."""
    name = settings.end_of_turn
    if name == "auto":
        from services.gateway.smart_turn import available

        name = "smart-turn" if available(settings.models_dir) else "silence"
    if name in POLICIES:
        return POLICIES[name](settings)
    module_name, _, attribute = name.partition(":")
    if not attribute:
        choices = ", ".join(END_OF_TURN_POLICIES)
        raise ValueError(f"unknown end-of-turn policy {name!r}; choose {choices} or module:factory")
    factory: Factory = getattr(importlib.import_module(module_name), attribute)
    return factory(settings)
