"""Where speech text may be cut into pieces, shared by the gateway's chunker (agent text →
TTS requests) and the TTS engines (a request → pieces rendered one by one)."""

from __future__ import annotations

from typing import Final

CLAUSE_MARKS: Final = ",;:—–"
SENTENCE_MARKS: Final = ".!?…。！？؟।"
QUOTES: Final = "\"'“”‘’()[]"
# fmt: off
PHRASE_STARTS: Final = frozenset((
    "and", "but", "or", "so", "because", "while", "when", "where", "which", "who", "that",
    "after", "before", "until", "if", "than", "as", "at", "by", "for", "from", "in", "into",
    "near", "of", "on", "over", "to", "under", "with", "without", "about",
))
# fmt: on
"""Words a phrase starts with (English): where a sentence with no comma may be cut."""


def starts_phrase(word: str) -> bool:
    """Whether `word` (as written, quotes and case aside) starts a phrase."""
    return word.lower().strip(QUOTES) in PHRASE_STARTS


def ends_sentence(text: str) -> bool:
    """Whether `text` ends at a sentence mark (closing quotes aside)."""
    stripped = text.rstrip().rstrip(QUOTES)
    return bool(stripped) and stripped[-1] in SENTENCE_MARKS
