"""One agent response: its text chunks, their audio in order, and what was heard."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Final

SECONDS_PER_WORD: Final = 0.4
"""How long a word takes to say (150 a minute), for the share heard of a sentence whose
audio is not all made yet when nothing of the response is finished to measure it by."""


@dataclass
class _Chunk:
    text: str
    audio: dict[int, bytes] = field(default_factory=dict)
    total: int | None = None  # number of audio pieces, known when TTS reports done
    failed: bool = False
    sent_bytes: int = 0

    @property
    def produced(self) -> int:
        """Audio bytes made for it so far: sent, and waiting to be."""
        return self.sent_bytes + sum(len(a) for a in self.audio.values())

    next_index: int = 0


class ResponseAudio:
    """Reorders TTS audio: chunks (seq) in order, pieces (index) in order; drops repeats.

    TTS workers may serve a response's chunks in parallel and a reclaimed job may
    repeat pieces: whatever arrives, the client hears each piece once, in order.
    """

    def __init__(self, response_id: str) -> None:
        self.response_id = response_id
        self.chunks: list[_Chunk] = []
        self.text_complete = False
        self._seq = 0
        self.changed = asyncio.Event()
        self.received_bytes = 0
        """Audio accepted so far (repeats not counted)."""

    def add_text(self, text: str) -> int:
        """Register the next text chunk; returns its sequence number."""
        self.chunks.append(_Chunk(text))
        self.changed.set()
        return len(self.chunks) - 1

    def finish_text(self) -> None:
        """No more text chunks will come."""
        self.text_complete = True
        self.changed.set()

    def add_audio(self, seq: int, index: int, pcm: bytes) -> bool:
        """Store one piece; False if it is a repeat or unknown."""
        if seq >= len(self.chunks) or index in self.chunks[seq].audio:
            return False
        if index < self.chunks[seq].next_index:
            return False
        self.chunks[seq].audio[index] = pcm
        self.received_bytes += len(pcm)
        self.changed.set()
        return True

    def finish_chunk(self, seq: int, pieces: int, failed: bool = False) -> None:
        """TTS finished chunk `seq` with `pieces` pieces (or failed)."""
        if seq < len(self.chunks):
            self.chunks[seq].total = pieces
            self.chunks[seq].failed = failed
            self.changed.set()

    def next_audio(self) -> bytes | None:
        """The next piece to play, if it has arrived."""
        while self._seq < len(self.chunks):
            chunk = self.chunks[self._seq]
            if chunk.next_index in chunk.audio:
                pcm = chunk.audio.pop(chunk.next_index)
                chunk.next_index += 1
                chunk.sent_bytes += len(pcm)
                return pcm
            if chunk.total is not None and chunk.next_index >= chunk.total:
                self._seq += 1
                continue
            return None
        return None

    @property
    def head_progress(self) -> tuple[int, int, int | None, bool]:
        """What the TTS did for the chunk to play next (its pieces come, its end): the
        progress that can end a wait for audio. New text is none, and pieces of later
        chunks (another worker's) play only after it: a stalled head stays stalled while
        they come."""
        if self._seq >= len(self.chunks):
            return (self._seq, 0, None, False)
        chunk = self.chunks[self._seq]
        return (self._seq, chunk.next_index + len(chunk.audio), chunk.total, chunk.failed)

    @property
    def complete(self) -> bool:
        """Every chunk's audio has been handed out."""
        return self.text_complete and self._seq >= len(self.chunks)

    @property
    def awaiting_audio(self) -> bool:
        """A chunk sent to TTS has not all its audio yet (the next audio is the TTS's to
        send, not the agent's text still to come)."""
        return self._seq < len(self.chunks)

    @property
    def any_failed(self) -> bool:
        return any(chunk.failed for chunk in self.chunks)

    @property
    def text(self) -> str:
        """What was said: every chunk but those whose TTS failed (never spoken)."""
        return " ".join(chunk.text for chunk in self.chunks if not chunk.failed)

    def heard_text(self, heard_bytes: int, rate: int | None = None) -> str:
        """The text the user heard, given how many audio bytes reached their ears.

        Whole chunks heard count fully; within the chunk playing, words are counted in
        proportion to its audio played: of its length once TTS finished it, else of the
        length its words will take (at the finished chunks' bytes per word, or, with none
        and the PCM16 `rate` given, at `SECONDS_PER_WORD`), never less than what came: a
        chunk cut short (a cancel, a TTS that stalled) does not count as said whole. A
        chunk whose TTS failed counts no words (what it played before failing, if
        anything, still takes its place in the audio).
        """
        per_word = self._bytes_per_word(rate)
        words: list[str] = []
        left = heard_bytes
        for chunk in self.chunks:
            if left <= 0:
                break
            produced = chunk.produced
            if chunk.failed:
                left -= produced
                continue
            chunk_words = chunk.text.split()
            if chunk.total is not None and left >= produced:
                words.extend(chunk_words)
                left -= produced
                continue
            length = produced
            if chunk.total is None and per_word is not None:  # still being made
                length = max(produced, round(len(chunk_words) * per_word))
            share = min(1.0, left / length) if length else 0.0
            words.extend(chunk_words[: int(len(chunk_words) * share)])
            break
        return " ".join(words)

    def _bytes_per_word(self, rate: int | None) -> float | None:
        """Audio bytes a word takes in this response: from its finished chunks, else from
        the speaking rate at `rate` (None: neither known)."""
        done = [c for c in self.chunks if c.total is not None and not c.failed and c.text.split()]
        spoken = sum(c.produced for c in done)
        said = sum(len(c.text.split()) for c in done)
        if spoken and said:
            return spoken / said
        return None if rate is None else 2 * rate * SECONDS_PER_WORD
