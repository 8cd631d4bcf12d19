"""The ASR engine protocol: what every speech recognizer offers the batcher."""

from __future__ import annotations

import threading
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar, cast, runtime_checkable

import numpy as np
import numpy.typing as npt

AudioF32 = npt.NDArray[np.float32]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class AsrInput:
    """One utterance: mono float32 samples in [-1, 1] at the engine's sample rate."""

    audio: AudioF32
    language: str | None = None
    source_rate: int | None = None
    """The rate the speech was captured at, when it is known and below the engine's (a
    phone's 8 kHz): a telephone-band utterance (services/common/audio/bandwidth.py)."""


@dataclass(frozen=True, slots=True)
class Transcript:
    """The result for one utterance."""

    text: str
    language: str | None = None
    duration_s: float = 0.0
    segments: list[dict[str, float | str]] = field(default_factory=list)
    avg_logprob: float | None = None
    """The engine's mean log-probability of the text's tokens (None: it does not say, or no
    words). Clear speech heard right scores about -0.3 to 0; a misheard fragment lower."""
    last_word_logprob: float | None = None
    """The engine's log-probability of the last word it wrote (None: it does not say, or
    no words). Near 0: sure; a misheard last word scores low (docs/turn-taking.md)."""


@dataclass(frozen=True, slots=True)
class Word:
    """One word with its times in the file (seconds) and the model's probability of it."""

    word: str
    start: float
    end: float
    probability: float


@dataclass(frozen=True, slots=True)
class Segment:
    """One stretch of a file's transcript, as Whisper's timestamp decoding cuts it."""

    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: list[Word] | None = None


Task = Literal["transcribe", "translate"]


@dataclass(frozen=True, slots=True)
class FileRequest:
    """A whole file to transcribe (the REST doors): timestamps, prompt, task and all.

    The streaming doors never take this path: their utterances go through the batched,
    timestamp-free `transcribe_batch`, which is what keeps them fast."""

    audio: AudioF32
    language: str | None = None
    task: Task = "transcribe"
    prompt: str | None = None
    """Text that comes before the audio (names, spellings, style): Whisper's initial prompt."""
    hotwords: str | None = None
    """Words likely to be spoken (faster-whisper's `hotwords`: a prefix prompt)."""
    word_timestamps: bool = False
    temperature: float = 0.0
    source_rate: int | None = None
    """The file's own sample rate (8 kHz: a phone recording)."""


@dataclass(frozen=True, slots=True)
class FileTranscript:
    """A file's transcript: its segments (and words, when asked for)."""

    text: str
    language: str
    duration_s: float
    segments: list[Segment]
    language_probability: float | None = None


class Interrupted(Exception):
    """An interruptible call gave up because its `stop` event was set."""


class AsrEngine(Protocol):
    """A speech recognizer. `load` and `transcribe_batch` block: call them off the event loop."""

    name: str
    sample_rate: int
    model: str
    device: str

    def load(self) -> None:
        """Load the model; raise EngineUnavailable with the fix in the message if it cannot."""

    def transcribe_batch(self, items: Sequence[AsrInput]) -> list[Transcript]:
        """Transcribe every item; the result list is in the same order."""
        ...


@runtime_checkable
class InterruptibleEngine(AsrEngine, Protocol):
    """An engine that can abandon a call part-way (so a final never waits for a partial)."""

    def transcribe_batch_until(
        self, items: Sequence[AsrInput], stop: threading.Event
    ) -> list[Transcript]:
        """As `transcribe_batch`, but raise Interrupted soon after `stop` is set."""
        ...


@runtime_checkable
class FileEngine(AsrEngine, Protocol):
    """An engine that also transcribes whole files with timestamps (the REST doors)."""

    def languages(self) -> list[str]:
        """The language codes the model knows (["en"] for an English-only model, which
        cannot translate either)."""
        ...

    def transcribe_file(self, request: FileRequest) -> FileTranscript:
        """Transcribe (or translate to English) one file of any length, with segments."""
        ...

    def file_steps(self, request: FileRequest) -> Generator[None, None, FileTranscript]:
        """`transcribe_file` a step at a time: each `next` does one piece of the model's
        work (the features and the language, then a 30 s window), and the generator
        returns the transcript. The batcher runs the steps whenever no utterance waits,
        so a long file delays a live stream's final by one step, not the whole file."""
        ...


def run_steps(steps: Generator[Any, None, T]) -> T:
    """Every step of stepwise work at once; its return value."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return cast(T, done.value)
