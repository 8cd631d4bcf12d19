"""Percentiles as every report computes them (nearest rank: each value was measured)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile: the smallest value with at least `q` % of them at or below
    it (no interpolation: every reported value was measured); 0.0 when there are none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = math.ceil(q * len(ordered) / 100)  # q × n first: 7 / 100 × 100 is 7.000000000000001
    return ordered[min(max(rank, 1), len(ordered)) - 1]


def summary(values: list[float]) -> dict[str, float]:
    """p50, p95, min and max of a run's measurements, rounded to 0.1."""
    return {
        "p50": round(percentile(values, 50), 1),
        "p95": round(percentile(values, 95), 1),
        "min": round(min(values), 1),
        "max": round(max(values), 1),
    }
