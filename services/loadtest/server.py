"""What the services say about themselves during a load level: /health and /metrics.

Sampled when each level's measured window opens and when the level ends: the end's
/health gives memory, queue depth and event-loop lag (over the level's time); the two
/health `process.cpu_seconds` give CPU use; the two /metrics give the histograms of
services/loadtest/breakdown.py: where voice-to-voice went, the engines' own time that
`gateway_added` subtracts, and the gateway's speculation counters that say whether it may.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

from services.client.credentials import bearer
from services.loadtest.breakdown import Histogram, counters, histograms

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
    histograms: dict[str, Histogram] = field(default_factory=dict)
    """The breakdown's histograms this service exports (breakdown.HISTOGRAMS)."""
    counters: dict[str, float] = field(default_factory=dict)
    """The breakdown's counters this service exports (breakdown.COUNTERS; empty: its
    /metrics was not read)."""


@dataclass
class Services:
    """The base URLs of the services a run watches (None: not watched)."""

    urls: dict[str, str | None] = field(default_factory=dict)
    api_key: str | None = field(default=None, repr=False)
    """Sent as `Authorization: Bearer` (services whose ops routes are protected)."""

    def sample(self, window_s: float = 60.0) -> dict[str, Sample | None]:
        return {
            name: None if url is None else _sample(name, url, window_s, self.api_key)
            for name, url in self.urls.items()
        }


def _sample(name: str, url: str, window_s: float, api_key: str | None) -> Sample:
    window = min(600.0, max(1.0, window_s))
    with httpx.Client(
        base_url=url.rstrip("/"), timeout=TIMEOUT_S, headers=bearer(api_key)
    ) as client:
        health = _json(client, f"/health?window_s={window:.0f}")
        metrics = _metrics(client)
    return Sample(time.time(), health, histograms(metrics, name), counters(metrics, name))


def _json(client: httpx.Client, path: str) -> dict[str, Any] | None:
    try:
        response = client.get(path)
        body = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def _metrics(client: httpx.Client) -> list[Any]:
    """Every sample of the service's /metrics (empty when it does not answer)."""
    try:
        response = client.get("/metrics")
    except httpx.HTTPError:
        return []
    if response.status_code != 200:
        return []
    return [s for family in text_string_to_metric_families(response.text) for s in family.samples]


def level_histograms(
    samples: dict[str, Sample | None],
) -> dict[str, Histogram]:
    """Every watched service's breakdown histograms in one map (their names never clash)."""
    return {k: h for sample in samples.values() if sample for k, h in sample.histograms.items()}


def gateway_counters(samples: dict[str, Sample | None]) -> dict[str, float]:
    """The gateway's breakdown counters (empty: not read)."""
    gateway = samples.get("gateway")
    return gateway.counters if gateway is not None else {}


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
