"""What one generated sequence says: its text cut to the item's cap, Whisper's mean token
log-probability (faster-whisper's `avg_logprob`), the no-speech rule, and the
log-probability of the last word, from the step logits where generate kept them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Final

import numpy as np

NO_SPEECH_PROB: Final = 0.6
LOW_AVG_LOGPROB: Final = -1.0
"""faster-whisper's defaults: above the first and below the second, a result is silence."""

Decoded = tuple[str, str, float | None, float | None]
"""One item's text, language, mean token log-probability and last word's log-probability."""


def decoded(decoder: Any, result: Any, limit: int, language: str, scores: bool) -> Decoded:
    """One CTranslate2 generate result read with `decoder` (a faster-whisper Tokenizer),
    its text cut to `limit` tokens; `scores`: the result holds each step's logits."""
    generated = result.sequences_ids[0]
    tokens = [int(t) for t in generated[:limit]]
    if not tokens:
        return "", language, None, None
    logits = result.logits[0] if scores else []
    if len(generated) > len(tokens) and len(logits) >= len(tokens):
        # cut to its cap: the mean over the tokens kept (a loop's later repeats are
        # confident, and would hide its doubtful start)
        steps = range(len(tokens))
        avg_logprob = sum(token_logprob(logits[i], tokens[i]) for i in steps) / len(tokens)
    else:
        # faster-whisper's avg_logprob: CTranslate2's score is the mean over the
        # generated tokens and the end of text; over them, and the end of text
        avg_logprob = float(result.scores[0]) * len(generated) / (len(generated) + 1)
    if float(result.no_speech_prob) > NO_SPEECH_PROB and avg_logprob < LOW_AVG_LOGPROB:
        return "", language, None, None
    text = str(decoder.decode(tokens)).strip()
    return text, language, avg_logprob, last_word_logprob(decoder, tokens, logits)


def last_word_logprob(decoder: Any, tokens: list[int], logits: Sequence[Any]) -> float | None:
    """The log-probability of the last word among `tokens` (the sum over its tokens),
    from the logits of the steps that chose them; None without words or logits."""
    if not tokens or len(logits) < len(tokens):
        return None
    pieces = [str(decoder.decode([token])) for token in tokens]
    span = last_word(pieces)
    if span is None:
        return None
    return sum(token_logprob(logits[step], tokens[step]) for step in range(*span))


def last_word(pieces: list[str]) -> tuple[int, int] | None:
    """[start, end) of the tokens of the last word among tokens decoded one by one: from
    the last token with a letter or digit back to the one that starts the word (a leading
    space, or the first token); None when no token has one."""
    spoken = [i for i, piece in enumerate(pieces) if any(c.isalnum() for c in piece)]
    if not spoken:
        return None
    end = spoken[-1] + 1
    start = end - 1
    while start > 0 and not pieces[start].startswith(" "):
        start -= 1
    return start, end


def token_logprob(step_logits: Any, token: int) -> float:
    """log softmax(step_logits)[token]: one step's vocabulary logits (a StorageView)."""
    if getattr(step_logits, "device", "cpu") != "cpu":
        import ctranslate2

        step_logits = step_logits.to_device(ctranslate2.Device.cpu)
    row = np.asarray(step_logits, dtype=np.float64).reshape(-1)
    top = float(row.max())
    return float(row[token] - top - math.log(float(np.exp(row - top).sum())))
