"""Where speech text may be cut into pieces, shared by the gateway's chunker (agent text →
TTS requests) and the TTS engines (a request → pieces rendered one by one)."""

from __future__ import annotations

import re
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


CONTROL_CHARACTERS: Final = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
"""C0 control characters but tab and line breaks, and DEL: no text to speak holds one (a NUL
stops the engines' C code: Piper raises on it)."""


def speakable(text: str) -> str:
    """`text` with its control characters made spaces: what an engine is given, whatever
    door the text came in by (the doors refuse them; an LLM's reply is not checked)."""
    return CONTROL_CHARACTERS.sub(" ", text)
