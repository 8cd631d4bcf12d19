"""Memory per session: a least-squares line over the loadtest levels, per component."""

from __future__ import annotations

import statistics

from services.plan.figures import MIB, derived, fmt, given, measured
from services.plan.inputs import Loadtest
from services.plan.model import MemoryLine, PlanOptions

# (service, field of its sample, label)
MEMORY = (
    ("gateway", "rss_bytes", "gateway RSS"),
    ("asr", "rss_bytes", "ASR RSS"),
    ("asr", "gpu_memory_used_bytes", "ASR GPU memory"),
    ("tts", "rss_bytes", "TTS RSS"),
    ("tts", "gpu_memory_used_bytes", "TTS GPU memory"),
)


def memory_lines(test: Loadtest, options: PlanOptions, missing: list[str]) -> list[MemoryLine]:
    """Fixed and per-session memory of each component, from a line over the levels."""
    lines = []
    for service, key, label in MEMORY:
        found = _samples(test, service, key)
        if len({sessions for _, sessions, _ in found}) < 2:
            missing.append(_memory_gap(test, service, key, label, len(found)))
        else:
            lines.append(_memory_line(test, found, service, key, label, options))
    return lines


def _samples(test: Loadtest, service: str, key: str) -> list[tuple[int, int, float]]:
    """(level index, sessions, value) of each level that reported `service`'s `key`."""
    found = []
    for index, level in enumerate(test.levels):
        sample = getattr(level.server, service, None) if level.server else None
        value = getattr(sample, key, None) if sample is not None else None
        if value is not None:
            found.append((index, level.sessions, float(value)))
    return found


def _memory_gap(test: Loadtest, service: str, key: str, label: str, points: int) -> str:
    sampled = any(getattr(lv.server, service, None) for lv in test.levels if lv.server)
    if not sampled and service != "gateway":
        return f"{label}: {service.upper()} not sampled: run the loadtest with --{service}-url"
    if not sampled:
        return f"{label}: the loadtest has no server samples (server.gateway)"
    health = getattr(test.target, service, None)
    if key == "gpu_memory_used_bytes" and points == 0:
        device = health.device if health is not None and health.device else "an unknown device"
        return f"{label}: not reported ({service.upper()} ran on {device})"
    return f"{label}: {points} level(s) reported it; a per-session slope needs two"


def _memory_line(
    test: Loadtest,
    found: list[tuple[int, int, float]],
    service: str,
    key: str,
    label: str,
    options: PlanOptions,
) -> MemoryLine:
    samples = [
        measured(value, "bytes", test, f"levels[{i}].server.{service}.{key}")
        for i, _, value in found
    ]
    points = [(float(sessions), value) for _, sessions, value in found]
    slope, fixed = statistics.linear_regression(*zip(*points, strict=True))
    listed = ", ".join(f"({fmt(x)}, {fmt(y / MIB)} MiB)" for x, y in points)
    fit = f"least squares over (sessions, {label}) = {listed}"
    per_session = derived(
        slope, "bytes/session", f"slope: Σ(x−x̄)(y−ȳ) ÷ Σ(x−x̄)²; {fit}", samples, estimate=False
    )
    fixed_part = derived(
        fixed, "bytes", f"intercept: ȳ − slope × x̄; {fit}", samples, estimate=False
    )
    at_target = None
    if options.target_sessions is not None:
        n = options.target_sessions
        at_target = derived(
            fixed + slope * n,
            "bytes",
            f"fixed + per session × {n} = {fmt(fixed / MIB)} MiB + {fmt(slope / MIB)} MiB × {n}",
            [fixed_part, per_session, given(n, "sessions", "--target-sessions")],
            estimate=True,
        )
    return MemoryLine(
        component=label,
        levels=[sessions for _, sessions, _ in found],
        fixed=fixed_part,
        per_session=per_session,
        at_target=at_target,
    )
