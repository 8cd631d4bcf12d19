"""What the services say about themselves during a load level: /health and /metrics.

Sampled at the start and the end of each level: the end's /health gives memory, queue
depth and event-loop lag (over the level's time); the two /health `process.cpu_seconds`
give CPU use; the two /metrics give the engines' own time per utterance and per first
audio chunk, which `gateway_added` subtracts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

ENGINE_TIME: Final = {
    "asr": ("va_asr_latency_seconds", {"mode": "final"}),
    "tts": ("va_tts_first_audio_seconds", {}),
}
"""Per service: the histogram of its own time per job (batcher/synthesizer to result)."""
TIMEOUT_S: Final = 5.0


def http_base(ws_url: str) -> str:
    """`ws://host:port/v1/stream` → `http://host:port` (wss → https)."""
    parts = urlsplit(ws_url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, "", "", ""))


@dataclass
class Sample:
    """One service at one moment."""

    at: float
    health: dict[str, Any] | None
    engine: tuple[float, float] | None = None  # (sum seconds, count) of its engine histogram


@dataclass
class Services:
    """The base URLs of the services a run watches (None: not watched)."""

    urls: dict[str, str | None] = field(default_factory=dict)

    def sample(self, window_s: float = 60.0) -> dict[str, Sample | None]:
        return {
            name: None if url is None else _sample(name, url, window_s)
            for name, url in self.urls.items()
        }


def _sample(name: str, url: str, window_s: float) -> Sample:
    window = min(600.0, max(1.0, window_s))
    with httpx.Client(base_url=url.rstrip("/"), timeout=TIMEOUT_S) as client:
        health = _json(client, f"/health?window_s={window:.0f}")
        engine = None
        if name in ENGINE_TIME:
            engine = _histogram(client, *ENGINE_TIME[name])
    return Sample(time.time(), health, engine)


def _json(client: httpx.Client, path: str) -> dict[str, Any] | None:
    try:
        response = client.get(path)
        body = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def _histogram(
    client: httpx.Client, metric: str, labels: dict[str, str]
) -> tuple[float, float] | None:
    try:
        response = client.get("/metrics")
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    totals = {"_sum": 0.0, "_count": 0.0}
    for family in text_string_to_metric_families(response.text):
        if family.name != metric:
            continue
        for sample in family.samples:
            suffix = sample.name.removeprefix(metric)
            if suffix in totals and all(sample.labels.get(k) == v for k, v in labels.items()):
                totals[suffix] += sample.value
    return totals["_sum"], totals["_count"]


def engine_ms(start: dict[str, Sample | None], end: dict[str, Sample | None]) -> float | None:
    """The engines' mean own time per turn over the level (ASR final + TTS first audio), ms.

    None when no engine service was watched or none did any work in between.
    """
    total, known = 0.0, False
    for name in ENGINE_TIME:
        before, after = start.get(name), end.get(name)
        if before is None or after is None or before.engine is None or after.engine is None:
            continue
        seconds = after.engine[0] - before.engine[0]
        count = after.engine[1] - before.engine[1]
        if count > 0:
            total += seconds / count * 1000
            known = True
    return total if known else None


def server_report(start: dict[str, Sample | None], end: dict[str, Sample | None]) -> dict[str, Any]:
    """LEVEL.server: per service its figures at the level's end (None when not watched)."""
    return {name: _figures(start.get(name), end.get(name)) for name in end}


def _figures(start: Sample | None, end: Sample | None) -> dict[str, Any] | None:
    if end is None or end.health is None:
        return None
    health = end.health
    gpu = health.get("gpu") or {}
    return {
        "rss_bytes": _process(end).get("rss_bytes"),
        "gpu_memory_used_bytes": gpu.get("memory_allocated") if gpu.get("available") else None,
        "queue_depth": health.get("queue_depth"),
        "active_connections": health.get("active_connections"),
        "event_loop_lag_ms": health.get("event_loop_lag_ms"),
        "timings_ms": health.get("timings_ms"),
        "cpu_percent": _cpu_percent(start, end),
    }


def _process(sample: Sample) -> dict[str, Any]:
    return (sample.health or {}).get("process") or {}


def _cpu_percent(start: Sample | None, end: Sample) -> float | None:
    """Per cent of one core the service used between the two samples."""
    if start is None or end.at <= start.at:
        return None
    before, after = _process(start), _process(end)
    if "cpu_seconds" not in before or "cpu_seconds" not in after:
        return None
    used = float(after["cpu_seconds"]) - float(before["cpu_seconds"])
    return round(100 * used / (end.at - start.at), 1)
