"""The traced figure: every number of the plan carries the files and fields it came from."""

from __future__ import annotations

import math
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

from services.plan.inputs import MeasurementFile

OPTIONS_PATH = "(plan options)"
MIB = 1024 * 1024


class Out(BaseModel):
    """Base of what the plan writes: frozen."""

    model_config = ConfigDict(frozen=True)


class Source(Out):
    path: str
    field: str
    command: str = ""
    timestamp: str = ""
    machine: str = ""


class Figure(Out):
    """One number of the plan, with where it came from."""

    value: float
    unit: str
    sources: list[Source]
    estimate: bool = False
    formula: str | None = None


def measured(value: float, unit: str, m: MeasurementFile, *fields: str) -> Figure:
    """A number copied from the fields of a measurement file."""
    sources = [
        Source(
            path=m.path,
            field=field,
            command=m.command,
            timestamp=m.timestamp,
            machine=m.machine.summary(),
        )
        for field in fields
    ]
    return Figure(value=value, unit=unit, sources=sources)


def given(value: float, unit: str, flag: str) -> Figure:
    """A number given on the command line as `flag`."""
    return Figure(value=value, unit=unit, sources=[Source(path=OPTIONS_PATH, field=flag)])


def derived(
    value: float, unit: str, formula: str, inputs: Iterable[Figure], estimate: bool | None = None
) -> Figure:
    """A figure computed from others: their sources, and ESTIMATE if any input was one."""
    figures = list(inputs)
    sources: list[Source] = []
    for figure in figures:
        sources.extend(s for s in figure.sources if s not in sources)
    marked = any(f.estimate for f in figures) if estimate is None else estimate
    return Figure(value=value, unit=unit, sources=sources, estimate=marked, formula=formula)


def fmt(value: float) -> str:
    """A number as a plan shows it: integers bare, others to three significant places."""
    if float(value).is_integer():
        return str(int(value))
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}" if abs(value) >= 1 else f"{value:.2g}"


def ceil_clean(value: float) -> int:
    """Ceiling that ignores float noise: 50 × 1.2 ÷ 10 is 6, not 7."""
    return math.ceil(round(value, 9))


def floor_clean(value: float) -> int:
    """Floor that ignores float noise."""
    return math.floor(round(value, 9))
