"""Cut the agent's streaming text into chunks for TTS: sentences, and a short first phrase.

Sentence ends are found by `sentencex` (Wikimedia's segmenter: rules for ~300 languages,
abbreviations such as "Dr." and "e.g.", initials, decimals, URLs; a compiled extension with
no dependencies, microseconds a call). A boundary counts once text follows it: "Dr. " may
go on as "Dr. Smith". A segment that is only a list number ("1.") stays with what follows.
"""

from __future__ import annotations

import re

import sentencex

from services.common.text import ends_sentence, starts_phrase

_CLAUSE_END = re.compile(r"[,;:—]\s+")
_WORD_THEN_SPACE = re.compile(r"(\S+)\s")
_MAYBE_END = re.compile(r"[.!?…\n。！？؟।]\S*\s*\S")
"""A sentence mark with text after it: only then is the segmenter asked (it is not free)."""
_ENUMERATOR = re.compile(
    r"(?:^|[:\n])\s*\(?\d{1,3}[.)]\s*$|\b(?:step|item|part|chapter|point|no)\.?\s+\d{1,3}\.\s*$",
    re.IGNORECASE,
)
"""A segment that ends in a list number ("1.", "Steps: 2.", "Step 3."), not a sentence
that ends in a number ("I paid 4.")."""


def sentence_end(text: str, language: str = "en") -> int | None:
    """Where the first complete sentence of `text` ends (its trailing space included), when
    more text follows it; None while the first sentence may still go on."""
    if not _MAYBE_END.search(text):
        return None
    offset = 0
    segments = list(sentencex.segment(language, text))
    for segment in segments[:-1]:
        offset += len(segment)
        if _ENUMERATOR.search(segment):
            continue  # "1. " / "Step 2. ": a list number goes with its item
        if text[:offset].strip():
            return offset
    return None


class Chunker:
    """Incremental: `feed` text deltas, get back chunks as soon as they are complete.

    A chunk ends at a sentence end. The first chunk may also end at a clause once it
    holds `first_chunk_words` words, or, with `first_chunk_phrase`, before a word that
    starts a phrase ("to", "with", "and"...) once that many words precede it: the first
    audio does not wait for the end of a long sentence with no comma (an LLM streams one in
    ~20 ms a word; the TTS engine cuts its own first piece the same way).
    """

    def __init__(
        self,
        first_chunk_words: int = 6,
        max_chars: int = 400,
        language: str | None = None,
        first_chunk_phrase: bool = True,
    ) -> None:
        self.first_chunk_words = first_chunk_words
        self.first_chunk_phrase = first_chunk_phrase
        self.max_chars = max_chars
        self.language = (language or "en").split("-")[0].lower()
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
        sentence = sentence_end(self._buffer, self.language)
        if sentence is not None:
            return sentence
        # A whole sentence already here (an echo, a fast agent) goes as one TTS job: cutting
        # it would only add a second job's start to the audio.
        if self.emitted == 0 and not ends_sentence(self._buffer):
            for clause in _CLAUSE_END.finditer(self._buffer):
                if len(self._buffer[: clause.start()].split()) >= self.first_chunk_words:
                    return clause.end()
            if self.first_chunk_phrase and self.language == "en":
                phrase = self._phrase_start()
                if phrase is not None:
                    return phrase
        if len(self._buffer) > self.max_chars:
            space = self._buffer.rfind(" ", 0, self.max_chars)
            return space + 1 if space > 0 else self.max_chars
        return None

    def _phrase_start(self) -> int | None:
        """Where a word that starts a phrase begins, once `first_chunk_words` whole words
        precede it and the word itself is whole (a space follows it)."""
        for count, word in enumerate(_WORD_THEN_SPACE.finditer(self._buffer)):
            if count >= self.first_chunk_words and starts_phrase(word.group(1)):
                return word.start()
        return None
