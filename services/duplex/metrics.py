"""Metrics of the duplex service (docs/metrics.md)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

STEP_SECONDS = Histogram(
    "va_duplex_step_seconds",
    "Wall time of one batched model step (encode, LM step, decode for every active slot); "
    "above 0.08 s the sessions cannot stay real time.",
    buckets=(0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5),
)
STEP_BATCH = Histogram(
    "va_duplex_step_batch_size",
    "Sessions stepped together in one model step.",
    buckets=(1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 64, 128),
)
FRAME_WAIT = Histogram(
    "va_duplex_frame_wait_seconds",
    "From a session's 80 ms frame being complete to the step that takes it starting.",
    buckets=(0.001, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28),
)
LATE_STEPS = Counter("va_duplex_late_steps_total", "Steps that took longer than one frame (80 ms).")
STEP_FAILURES = Counter(
    "va_duplex_step_failures_total", "Steps the engine failed (their sessions end with 1011)."
)
SESSIONS = Gauge("va_duplex_live_sessions", "Sessions holding a slot now.")
SLOTS = Gauge("va_duplex_slots", "Slots (max_sessions): the batch the model is stepped with.")
SESSIONS_OPENED = Counter(
    "va_duplex_sessions_total", "Sessions admitted, by endpoint (pcm, moshi).", ["endpoint"]
)
SESSIONS_REFUSED = Counter(
    "va_duplex_sessions_refused_total",
    "Sessions refused at admission, by reason (capacity, draining).",
    ["reason"],
)
STATE_BYTES = Gauge(
    "va_duplex_state_bytes_per_slot",
    "Bytes of streaming state (KV caches, codec buffers) one slot holds on the model's device.",
)
