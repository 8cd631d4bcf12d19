"""The response formats of the transcription doors: json, text, verbose_json, srt, vtt.

`verbose_json` is OpenAI's shape (`task`, `language`, `duration`, `text`, `segments`
with times and scores, `words` when word timestamps were asked for); the language is
the ISO code Whisper uses (`en`, `de`), not OpenAI's English name of it. `srt` and
`vtt` have one cue per segment.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from fastapi.responses import JSONResponse, PlainTextResponse, Response

from services.asr.engines.base import FileTranscript, Segment, Task, Transcript

ResponseFormat = Literal["json", "text", "verbose_json", "srt", "vtt"]
FORMATS: Final = ("json", "text", "verbose_json", "srt", "vtt")
TIMED: Final = frozenset({"verbose_json", "srt", "vtt"})
"""Formats that need segment times: they take the whole-file path."""


def timestamp(seconds: float, sep: str) -> str:
    """`HH:MM:SS,mmm` (srt) or `HH:MM:SS.mmm` (vtt)."""
    ms = round(max(seconds, 0.0) * 1000)
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def srt(segments: list[Segment], duration: float) -> str:
    cues = [f"{i}\n{_cue(s, duration, ',')}\n{s.text.strip()}\n" for i, s in enumerate(segments, 1)]
    return "\n".join(cues)


def vtt(segments: list[Segment], duration: float) -> str:
    cues = [f"{_cue(s, duration, '.')}\n{s.text.strip()}\n" for s in segments]
    return "\n".join(["WEBVTT\n", *cues])


def _cue(segment: Segment, duration: float, sep: str) -> str:
    start, end = _at(segment.start, duration), _at(segment.end, duration)
    return f"{timestamp(start, sep)} --> {timestamp(end, sep)}"


def from_utterance(transcript: Transcript) -> FileTranscript:
    """A batched (timestamp-free) transcript as a file transcript: text and language."""
    return FileTranscript(
        text=transcript.text,
        language=transcript.language or "en",
        duration_s=transcript.duration_s,
        segments=[],
    )


def render(
    result: FileTranscript,
    fmt: ResponseFormat,
    task: Task = "transcribe",
    granularities: frozenset[str] = frozenset(),
) -> Response:
    """The response in the requested format."""
    if fmt == "text":
        return PlainTextResponse(result.text)
    if fmt == "srt":
        return PlainTextResponse(srt(result.segments, result.duration_s))
    if fmt == "vtt":
        return PlainTextResponse(vtt(result.segments, result.duration_s), media_type="text/vtt")
    if fmt == "json":
        return JSONResponse({"text": result.text})
    return JSONResponse(verbose(result, task, granularities))


def verbose(
    result: FileTranscript, task: Task, granularities: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """OpenAI's `verbose_json`: segments unless only words were asked for; words when
    they were."""
    body: dict[str, Any] = {
        "task": task,
        "language": "en" if task == "translate" else result.language,
        "duration": round(result.duration_s, 3),
        "text": result.text,
    }
    end = result.duration_s
    if not granularities or "segment" in granularities:
        body["segments"] = [_segment(s, end) for s in result.segments]
    if "word" in granularities:
        body["words"] = [
            {
                "word": w.word.strip(),
                "start": _at(w.start, end),
                "end": _at(w.end, end),
                "probability": round(w.probability, 4),
            }
            for s in result.segments
            for w in s.words or []
        ]
    if task == "transcribe" and result.language_probability is not None:
        body["language_probability"] = round(result.language_probability, 4)
    return body


def _at(seconds: float, duration: float) -> float:
    """A time in the file, in ms precision, never past its end (Whisper's last timestamp
    token can land up to a few tens of ms beyond the audio)."""
    return round(min(max(seconds, 0.0), duration), 3)


def _segment(segment: Segment, duration: float) -> dict[str, Any]:
    return {
        "id": segment.id,
        "seek": segment.seek,
        "start": _at(segment.start, duration),
        "end": _at(segment.end, duration),
        "text": segment.text,
        "tokens": segment.tokens,
        "temperature": segment.temperature,
        "avg_logprob": segment.avg_logprob,
        "compression_ratio": segment.compression_ratio,
        "no_speech_prob": segment.no_speech_prob,
    }
