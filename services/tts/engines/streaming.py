"""Streaming pieces for token-based TTS (chatterbox): pure numpy, no model.

- `TokenChunker` cuts the speech-token stream into segments to render: a small
  first one (the first audio leaves early), then `size`-token ones, each carrying up
  to `context` earlier tokens so the vocoder sees what came before.
- `CrossFader` joins the rendered segments: a segment's audio for its context
  tokens is dropped, the last `overlap` samples of each segment are held back, and
  the next segment's rendering of those same samples fades in over them (raised
  cosine), so a join is a smooth transition between two renderings of the same
  sound, never a jump.
- `FairLock` hands a shared model to threads in the order they asked for it, so
  every stream gets its turn step after step.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import TracebackType

import numpy as np

from services.tts.engines.base import AudioF32


@dataclass(frozen=True, slots=True)
class Segment:
    """Tokens to render: `tokens[0]` is token number `start` of the utterance."""

    start: int
    tokens: tuple[int, ...]
    final: bool

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


class TokenChunker:
    """Collects speech tokens and says when a segment is ready to render."""

    def __init__(self, first: int, size: int, context: int) -> None:
        if first < 1 or size < 1 or context < 0:
            raise ValueError("chunk sizes must be positive and context not negative")
        self.first = first
        self.size = size
        self.context = context
        self._tokens: list[int] = []
        self._rendered = 0
        """Tokens already covered by a segment."""

    def push(self, token: int) -> Segment | None:
        """Add one token; a segment when enough new tokens have come."""
        self._tokens.append(token)
        target = self.first if self._rendered == 0 else self.size
        if len(self._tokens) - self._rendered < target:
            return None
        return self._segment(final=False)

    def finish(self) -> Segment | None:
        """The last segment (its end is the end of speech); None if there were no tokens."""
        if not self._tokens:
            return None
        return self._segment(final=True)

    def _segment(self, final: bool) -> Segment:
        start = max(0, self._rendered - self.context)
        self._rendered = len(self._tokens)
        return Segment(start, tuple(self._tokens[start:]), final)


def fade_in(length: int) -> AudioF32:
    """Raised-cosine weights rising from ~0 to ~1 over `length` samples."""
    phase = (np.arange(length, dtype=np.float64) + 0.5) / max(length, 1)
    return (0.5 - 0.5 * np.cos(np.pi * phase)).astype(np.float32)


class CrossFader:
    """Joins overlapping renderings into one continuous signal, emitted as it firms up.

    Positions are global sample indices in the utterance. `push(start, audio, final)`
    takes a rendering whose first sample is at `start` and returns the samples that
    are now final; everything before the held-back tail has been returned exactly once.
    """

    def __init__(self, overlap: int) -> None:
        self.overlap = max(0, overlap)
        self.emitted = 0
        self._tail = np.zeros(0, dtype=np.float32)

    def push(self, start: int, audio: AudioF32, final: bool) -> AudioF32:
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        held_end = self.emitted + self._tail.size
        if start > held_end:  # a gap: keep the timing with silence
            silence = np.zeros(start - held_end, dtype=np.float32)
            joined = np.concatenate([self._tail, silence, audio])
        else:
            joined = self._join(start, audio)
        keep = 0 if final else min(self.overlap, joined.size)
        out, self._tail = joined[: joined.size - keep], joined[joined.size - keep :]
        self.emitted += out.size
        return out

    def _join(self, start: int, audio: AudioF32) -> AudioF32:
        """The held tail and `audio` merged, from `self.emitted` on."""
        tail = self._tail
        if start < self.emitted:  # the rendering of context already sent: drop it
            audio = audio[self.emitted - start :]
            prefix = np.zeros(0, dtype=np.float32)
        else:  # the tail begins before this rendering does: that part stays as it is
            prefix, tail = tail[: start - self.emitted], tail[start - self.emitted :]
        length = min(tail.size, audio.size)
        weights = fade_in(length)
        mixed = tail[:length] * (1.0 - weights) + audio[:length] * weights
        rest = audio[length:] if audio.size >= tail.size else tail[length:]
        return np.concatenate([prefix, mixed, rest]).astype(np.float32, copy=False)


class FairLock:
    """A FIFO lock: threads acquire it in the order they asked (`threading.Lock` is not
    fair: a thread that releases and asks again at once usually wins)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next = 0
        self._serving = 0

    def __enter__(self) -> None:
        with self._cond:
            ticket = self._next
            self._next += 1
            self._cond.wait_for(lambda: self._serving == ticket)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        with self._cond:
            self._serving += 1
            self._cond.notify_all()

    def waiting(self) -> int:
        """Threads holding or waiting for the lock."""
        with self._cond:
            return self._next - self._serving
