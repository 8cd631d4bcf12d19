"""Metrics of the ASR service."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

ASR_LATENCY = Histogram(
    "va_asr_latency_seconds",
    "From an utterance entering the batcher to its transcript, by mode (final, partial).",
    ["mode"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0),
)
ASR_QUEUE_WAIT = Histogram(
    "va_asr_queue_wait_seconds",
    "From an utterance entering the batcher to its batch starting on the model, by mode.",
    ["mode"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0),
)
ASR_COMPUTE = Histogram(
    "va_asr_compute_seconds",
    "Wall time of the batched model call that transcribed an utterance, per utterance, by mode.",
    ["mode"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0),
)
ASR_INFERENCE = Histogram(
    "va_asr_inference_seconds",
    "Wall time of one batched model call.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 1.0, 2.0, 5.0),
)
ASR_BATCH_SIZE = Histogram(
    "va_asr_batch_size",
    "Utterances per batched model call.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128),
)
ASR_AUDIO_SECONDS = Counter("va_asr_audio_seconds_total", "Seconds of audio transcribed.")
ASR_PREEMPTED = Counter(
    "va_asr_partials_preempted_total",
    "Partial transcripts interrupted so a final could run at once (they run again after).",
)
ASR_SPECULATIVE = Counter(
    "va_asr_speculative_total",
    "Speculative finals of /v1/stream/asr (started at a pause): used as the segment's "
    "final, or wasted because the user went on.",
    ["outcome"],
)
ASR_DROPPED = Counter(
    "va_asr_dropped_total", "Utterances refused or dropped, by reason.", ["reason"]
)
ASR_MODEL_LOADS = Counter(
    "va_asr_model_loads_total",
    "Whisper models loaded or unloaded in this process, by event (loaded, failed, evicted).",
    ["event"],
)
