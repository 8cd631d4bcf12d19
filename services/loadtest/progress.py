"""The live progress line of a load test, on stderr.

On a terminal it is one line rewritten in place; otherwise (a log, CI) a plain line
every few seconds.
"""

from __future__ import annotations

import sys
import time
from typing import Final, TextIO

from services.common.report import percentile
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
        self.sessions = 0
        self.epoch = self.ramp_s = self.duration_s = 0.0
        self._shown_at = 0.0

    def start_level(self, sessions: int, epoch: float, ramp_s: float, duration_s: float) -> None:
        self.index += 1
        self.sessions, self.epoch = sessions, epoch
        self.ramp_s, self.duration_s = ramp_s, duration_s
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
        measured_from = self.epoch + self.ramp_s
        until = measured_from + self.duration_s
        if now < measured_from:
            phase = f"ramp {measured_from - now:.0f} s"
        elif now < until:
            phase = f"measuring {until - now:.0f} s left"
        else:
            phase = "finishing turns"
        recent = (snapshot.v2v_ms or [])[-RECENT:]
        v2v = f"{percentile(recent, 50):.0f} ms" if recent else "-"
        return (
            f"level {self.index}/{self.levels}: {self.sessions} sessions, {phase} | "
            f"up {snapshot.up} | turns {snapshot.turns} | errors {snapshot.errors} | "
            f"v2v p50 {v2v}"
        )

    def end_level(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
