"""Metrics of the TTS service."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

TTS_FIRST_AUDIO = Histogram(
    "va_tts_first_audio_seconds",
    "From a request getting its synthesis slot to its first audio chunk.",
    buckets=(0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0),
)
TTS_QUEUE_WAIT = Histogram(
    "va_tts_queue_wait_seconds",
    "From a request reaching the synthesizer to a synthesis slot being free for it.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0),
)
TTS_RTF = Histogram(
    "va_tts_real_time_factor",
    "Synthesis wall time divided by the audio's duration (below 1 is faster than real time).",
    buckets=(0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0),
)
TTS_AUDIO_SECONDS = Counter("va_tts_audio_seconds_total", "Seconds of audio synthesized.")
TTS_CANCELLED = Counter(
    "va_tts_cancelled_total",
    "Syntheses stopped by a cancellation: a bus job's, or a `cancel` on /v1/stream/tts.",
)
