"""Two threads taking turns at a fair lock, in an order the lock alone decides."""

from __future__ import annotations

import threading
import time

from services.tts.engines.streaming import FairLock


class TakingTurns:
    """`hold()`, called by a thread holding `lock`, keeps its turn until the other thread
    waits for the lock (or has ended: `done()`): the next turn is then the other's, whatever
    the OS scheduler does (a thread descheduled between two turns of its own otherwise lets
    the other take several in a row)."""

    def __init__(self, lock: FairLock, threads: int = 2) -> None:
        self.lock = lock
        self.threads = threads
        self._running = threads
        self._guard = threading.Lock()

    def hold(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.lock.waiting() < self.threads:
            with self._guard:
                if self._running < self.threads:
                    return
            assert time.monotonic() < deadline, "the other thread never asked for a turn"
            time.sleep(0.0002)

    def done(self) -> None:
        """This thread takes no more turns."""
        with self._guard:
            self._running -= 1
