"""Metrics every service exports, and the `/metrics` response.

Names follow Prometheus conventions (`_seconds`, `_total`, `_bytes`); labels stay
low-cardinality (service, route, code). Service-specific metrics live in each
service's own `metrics.py`. docs/metrics.md lists them all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
LOOP_LAG_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""Event-loop lag: a healthy loop answers within a millisecond or two; 20 ms is audible."""

REQUEST_DURATION = Histogram(
    "va_request_duration_seconds",
    "Time to serve one request or job, by service and route.",
    ["service", "route"],
    buckets=LATENCY_BUCKETS,
)
REQUESTS = Counter(
    "va_requests_total",
    "Requests and jobs served, by service, route and outcome (ok, error or cancelled).",
    ["service", "route", "outcome"],
)
REST_ROUTES: Final[Mapping[tuple[str, str], str]] = {
    ("asr", "/v1/audio/transcriptions"): "transcriptions",
    ("asr", "/v1/audio/translations"): "translations",
    ("tts", "/v1/audio/speech"): "speech",
}
"""(service, path) → `route` of the REST requests REQUESTS counts: `ok` where each is
served, `error` for every error one gets back (services/common/service/routes.py)."""
ERRORS = Counter(
    "va_errors_total", "Errors returned to clients, by service and error code.", ["service", "code"]
)
ACTIVE_CONNECTIONS = Gauge("va_active_connections", "Open WebSocket connections.", ["service"])
QUEUE_DEPTH = Gauge(
    "va_queue_depth", "Work waiting for the model (or for a worker), by service.", ["service"]
)
GPU_UTILIZATION = Gauge(
    "va_gpu_utilization_ratio", "GPU utilization (0-1) of the service's GPU.", ["service", "gpu"]
)
GPU_MEMORY_USED = Gauge(
    "va_gpu_memory_used_bytes", "GPU memory in use on the service's GPU.", ["service", "gpu"]
)
GPU_MEMORY_TOTAL = Gauge(
    "va_gpu_memory_total_bytes", "GPU memory in total on the service's GPU.", ["service", "gpu"]
)
EVENT_LOOP_LAG = Histogram(
    "va_event_loop_lag_seconds",
    "How late the event loop ran a timer due now (time the loop was kept busy), by service.",
    ["service"],
    buckets=LOOP_LAG_BUCKETS,
)
READY = Gauge("va_ready", "1 when the service is ready (model loaded, Redis up).", ["service"])


def render() -> tuple[bytes, str]:
    """The Prometheus text exposition of this process's metrics, and its content type."""
    return generate_latest(), CONTENT_TYPE_LATEST


AUTH_REFUSED = Counter(
    "va_auth_refused_total",
    "Requests and WebSocket handshakes refused at the door (no or bad credential, Origin, "
    "another tenant's session, a limit), by service and error code.",
    ["service", "code"],
)
