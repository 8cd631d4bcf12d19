"""The `fake` ASR engine: no model, a fixed transcript at a known cost.

It still goes through everything a real engine does (Redis jobs, the batcher, one call
per batch in a worker thread), so a stack running it measures what the gateway and the
bus add; `latency_ms` simulates an engine of known cost per batched call.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from services.asr.engines.base import AsrInput, Transcript
from services.asr.settings import FakeAsrSettings


class FakeAsrEngine:
    """Hears every utterance as `settings.text`; one call per batch, `latency_ms` long."""

    name = "fake"
    sample_rate = 16000
    model = "fake"
    device = "cpu"

    def __init__(self, settings: FakeAsrSettings) -> None:
        self.settings = settings
        self.calls = 0
        """Batched calls made so far."""

    def load(self) -> None:
        """Nothing to load."""

    def transcribe_batch(self, items: Sequence[AsrInput]) -> list[Transcript]:
        self.calls += 1
        if self.settings.latency_ms > 0:
            time.sleep(self.settings.latency_ms / 1000)
        return [self._transcript(item) for item in items]

    def _transcript(self, item: AsrInput) -> Transcript:
        duration = item.audio.size / self.sample_rate
        return Transcript(self.settings.text, item.language or "en", duration)
