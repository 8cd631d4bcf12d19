"""Footnotes for the markdown plan, and how a figure reads in a table cell."""

from __future__ import annotations

import string
from collections.abc import Sequence

from services.plan.figures import MIB, OPTIONS_PATH, Figure, Source, fmt

WORD = string.ascii_letters + string.digits + "_"


class Citations:
    """Footnotes: one number per file and the fields cited together from it."""

    def __init__(self) -> None:
        self.numbers: dict[tuple[str, tuple[str, ...]], int] = {}
        self.sources: dict[str, Source] = {}

    def __call__(self, *figures: Figure | None) -> str:
        """`[1][2]`: the footnotes of these figures, numbered on first use."""
        fields: dict[str, list[str]] = {}
        for figure in figures:
            for source in figure.sources if figure is not None else []:
                listed = fields.setdefault(source.path, [])
                if source.field not in listed:
                    listed.append(source.field)
                self.sources.setdefault(source.path, source)
        marks = []
        for path, listed in fields.items():
            number = self.numbers.setdefault((path, tuple(listed)), len(self.numbers) + 1)
            marks.append(f"[{number}]")
        return "".join(marks)

    def lines(self) -> list[str]:
        """The footnotes: file, command, time, machine and fields of each number."""
        found = []
        for (path, fields), number in self.numbers.items():
            s = self.sources[path]
            if path == OPTIONS_PATH:
                found.append(f"- [{number}] plan options — {', '.join(fields)}")
            else:
                found.append(
                    f"- [{number}] {path} — `{s.command}` — {s.timestamp} — {s.machine} — "
                    + "; ".join(_compress(fields))
                )
        return found


def _compress(fields: Sequence[str]) -> list[str]:
    """`a.p50`, `a.p95`, `a.p99` as `a.{p50,p95,p99}`: fields grouped by all but their last word."""
    groups: dict[str, list[str]] = {}
    for field in fields:
        head = field.rstrip(WORD)
        groups.setdefault(head, []).append(field[len(head) :])
    return [
        head + (tails[0] if len(tails) == 1 else "{" + ",".join(tails) + "}")
        for head, tails in groups.items()
    ]


def cell(text: str, marks: str) -> str:
    """Text and its footnote marks, if any."""
    return f"{text} {marks}" if marks else text


def as_text(figure: Figure | None, unit: str = "") -> str:
    """`12`, `12 turns/s`, `12 (ESTIMATE)`; `—` for no figure."""
    if figure is None:
        return "—"
    return _marked(f"{fmt(figure.value)}{unit}", figure)


def as_bytes(figure: Figure | None) -> str:
    """Bytes as MiB, or GiB from 1024 MiB."""
    if figure is None:
        return "—"
    mib = figure.value / MIB
    return _marked(f"{fmt(mib / 1024)} GiB" if abs(mib) >= 1024 else f"{fmt(mib)} MiB", figure)


def _marked(text: str, figure: Figure) -> str:
    return f"{text} (ESTIMATE)" if figure.estimate else text
