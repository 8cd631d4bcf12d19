"""One agent response: its text chunks, their audio in order, and what was heard."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass
class _Chunk:
    text: str
    audio: dict[int, bytes] = field(default_factory=dict)
    total: int | None = None  # number of audio pieces, known when TTS reports done
    failed: bool = False
    sent_bytes: int = 0
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

    def heard_text(self, heard_bytes: int) -> str:
        """The text the user heard, given how many audio bytes reached their ears.

        Whole chunks heard count fully; within the chunk playing, words are counted in
        proportion to its audio played (its length known once TTS finished it). A chunk
        whose TTS failed counts no words (what it played before failing, if anything, still
        takes its place in the audio).
        """
        words: list[str] = []
        left = heard_bytes
        for chunk in self.chunks:
            if left <= 0:
                break
            produced = chunk.sent_bytes + sum(len(a) for a in chunk.audio.values())
            if chunk.failed:
                left -= produced
                continue
            chunk_words = chunk.text.split()
            if chunk.total is not None and left >= produced:
                words.extend(chunk_words)
                left -= produced
                continue
            share = min(1.0, left / produced) if produced else 0.0
            words.extend(chunk_words[: int(len(chunk_words) * share)])
            break
        return " ".join(words)
