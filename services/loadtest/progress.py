"""The live progress line of a load test, on stderr.

On a terminal it is one line rewritten in place; otherwise (a log, CI) a plain line
every few seconds.
"""

from __future__ import annotations

import sys
import time
from typing import Final, TextIO

from services.common.stats import percentile
from services.loadtest.user import Window
from services.loadtest.workers import Snapshot

PLAIN_EVERY_S: Final = 5.0
RECENT: Final = 100
"""The current p50 voice-to-voice is over this many latest turns."""


class ProgressLine:
    """Shows `Snapshot`s of the level that is running (`start_level` first)."""

    def __init__(self, stream: TextIO | None = None, levels: int = 1) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.levels = levels
        self.index = 0
        self.timeline = Window(0.0, 0.0, 0.0, 0)
        self._shown_at = 0.0

    def start_level(self, timeline: Window) -> None:
        """The next level, on time.time()."""
        self.index += 1
        self.timeline = timeline
        self._shown_at = 0.0

    def __call__(self, snapshot: Snapshot) -> None:
        now = time.time()
        if not self.tty and now - self._shown_at < PLAIN_EVERY_S:
            return
        self._shown_at = now
        text = self.text(snapshot, now)
        if self.tty:
            self.stream.write(f"\r\x1b[K{text}")
        else:
            self.stream.write(f"{text}\n")
        self.stream.flush()

    def text(self, snapshot: Snapshot, now: float) -> str:
        measured_from, until = self.timeline.measured_from, self.timeline.until
        if now < measured_from:
            phase = f"ramp {measured_from - now:.0f} s"
        elif now < until:
            phase = f"measuring {until - now:.0f} s left"
        elif snapshot.turns < self.timeline.min_turns:
            phase = f"measuring on to {self.timeline.min_turns} turns"
        else:
            phase = "finishing turns"
        recent = (snapshot.v2v_ms or [])[-RECENT:]
        v2v = f"{percentile(recent, 50):.0f} ms" if recent else "-"
        ramp = f" (+{snapshot.ramp_turns} in ramp)" if snapshot.ramp_turns else ""
        return (
            f"level {self.index}/{self.levels}: {self.timeline.sessions} sessions, {phase} | "
            f"up {snapshot.up} | turns {snapshot.turns}{ramp} | errors {snapshot.errors} | "
            f"v2v p50 {v2v}"
        )

    def end_level(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
