"""Cut the agent's streaming text into chunks for TTS: sentences, and a short first clause."""

from __future__ import annotations

import re

_SENTENCE_END = re.compile(r"[.!?…]+[\"')\]]*\s+")
_CLAUSE_END = re.compile(r"[,;:—]\s+")


class Chunker:
    """Incremental: `feed` text deltas, get back chunks as soon as they are complete.

    A chunk ends at a sentence end. The first chunk may also end at a clause once it
    holds `first_chunk_words` words, so the first audio leaves early.
    """

    def __init__(self, first_chunk_words: int = 6, max_chars: int = 400) -> None:
        self.first_chunk_words = first_chunk_words
        self.max_chars = max_chars
        self._buffer = ""
        self.emitted = 0

    def feed(self, delta: str) -> list[str]:
        """Add text; return the chunks it completed."""
        self._buffer += delta
        chunks: list[str] = []
        while chunk := self._take():
            chunks.append(chunk)
        return chunks

    def flush(self) -> list[str]:
        """The rest of the text, as a last chunk (if any)."""
        rest, self._buffer = self._buffer.strip(), ""
        if not rest:
            return []
        self.emitted += 1
        return [rest]

    def _take(self) -> str | None:
        cut = self._cut()
        if cut is None:
            return None
        chunk, self._buffer = self._buffer[:cut].strip(), self._buffer[cut:]
        if not chunk:
            return None
        self.emitted += 1
        return chunk

    def _cut(self) -> int | None:
        sentence = _SENTENCE_END.search(self._buffer)
        if sentence:
            return sentence.end()
        if self.emitted == 0:
            for clause in _CLAUSE_END.finditer(self._buffer):
                if len(self._buffer[: clause.start()].split()) >= self.first_chunk_words:
                    return clause.end()
        if len(self._buffer) > self.max_chars:
            space = self._buffer.rfind(" ", 0, self.max_chars)
            return space + 1 if space > 0 else self.max_chars
        return None
