"""Machines needed for N users, per basis of sessions per machine."""

from __future__ import annotations

from collections.abc import Sequence

from services.plan.figures import Figure, ceil_clean, derived, fmt, given
from services.plan.model import PlanOptions, Sizing


def sizing(
    bases: Sequence[tuple[str, Figure]],
    pace: Figure | None,
    options: PlanOptions,
    missing: list[str],
) -> list[Sizing]:
    """Machines for --users at --concurrency-ratio, per basis of sessions per machine."""
    if options.users is None or options.concurrency_ratio is None:
        absent = "--users" if options.users is None else "--concurrency-ratio"
        missing.append(
            f"machines needed: not computed without {absent} "
            "(peak concurrent sessions = users × concurrency ratio)"
        )
        return []
    users = given(options.users, "users", "--users")
    ratio = given(options.concurrency_ratio, "fraction", "--concurrency-ratio")
    peak = derived(
        ceil_clean(users.value * ratio.value),
        "sessions",
        f"ceil(users × concurrency ratio) = ceil({fmt(users.value)} × {fmt(ratio.value)})",
        [users, ratio],
    )
    rate = None
    if pace is not None:
        rate = derived(
            peak.value * pace.value / 60,
            "turns/s",
            f"peak sessions × turns per session-minute ÷ 60 = {fmt(peak.value)} × "
            f"{fmt(pace.value)} ÷ 60",
            [peak, pace],
        )
    found = []
    for basis, per_machine in bases:
        if per_machine.value < 1:
            missing.append(f"machines needed ({basis}): under one session per machine")
            continue
        found.append(_size(basis, peak, rate, per_machine, options))
    return found


def _size(
    basis: str, peak: Figure, rate: Figure | None, per_machine: Figure, options: PlanOptions
) -> Sizing:
    machines = derived(
        ceil_clean(peak.value / per_machine.value),
        "machines",
        f"ceil(peak sessions ÷ sessions per machine) = ceil({fmt(peak.value)} ÷ "
        f"{fmt(per_machine.value)})",
        [peak, per_machine],
    )
    with_headroom = None
    if options.headroom > 0:
        headroom = given(options.headroom, "fraction", "--headroom")
        with_headroom = derived(
            ceil_clean(peak.value * (1 + headroom.value) / per_machine.value),
            "machines",
            f"ceil(peak sessions × (1 + headroom) ÷ sessions per machine) = "
            f"ceil({fmt(peak.value)} × {fmt(1 + headroom.value)} ÷ {fmt(per_machine.value)})",
            [peak, headroom, per_machine],
        )
    return Sizing(
        basis=basis,
        peak_sessions=peak,
        peak_turns_per_s=rate,
        sessions_per_machine=per_machine,
        machines=machines,
        machines_with_headroom=with_headroom,
    )
