"""The `fake` ASR engine: no model, a fixed transcript at a known cost.

It still goes through everything a real engine does (Redis jobs, the batcher, one call
per batch in a worker thread), so a stack running it measures what the gateway and the
bus add; `latency_ms` simulates an engine of known cost per batched call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence

from services.asr.engines.base import (
    AsrInput,
    FileRequest,
    FileTranscript,
    Segment,
    Transcript,
    Word,
)
from services.asr.settings import FakeAsrSettings


class FakeAsrEngine:
    """Hears every utterance as `settings.text`; one call per batch, `latency_ms` long."""

    name = "fake"
    sample_rate = 16000
    model = "fake"
    device = "cpu"

    def __init__(
        self, settings: FakeAsrSettings, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self.settings = settings
        self._sleep = sleep
        """How the latency is paid (a test passes its own, to count it without waiting)."""
        self.calls = 0
        """Batched calls made so far."""
        self.files: list[FileRequest] = []
        """Every whole-file request, as the engine got it (prompt, task, ...)."""

    def load(self) -> None:
        """Nothing to load."""

    def transcribe_batch(self, items: Sequence[AsrInput]) -> list[Transcript]:
        self.calls += 1
        if self.settings.latency_ms > 0:
            self._sleep(self.settings.latency_ms / 1000)
        return [self._transcript(item) for item in items]

    def _transcript(self, item: AsrInput) -> Transcript:
        duration = item.audio.size / self.sample_rate
        return Transcript(self.settings.text, item.language or "en", duration)

    def languages(self) -> list[str]:
        return ["en"]

    def file_steps(self, request: FileRequest) -> Generator[None, None, FileTranscript]:
        """`transcribe_file` after one empty step (a real engine takes one per window)."""
        yield
        return self.transcribe_file(request)

    def transcribe_file(self, request: FileRequest) -> FileTranscript:
        """The fixed text as one segment, its words spread evenly over the audio."""
        self.files.append(request)
        duration = request.audio.size / self.sample_rate
        spoken = self.settings.text.split()
        step = duration / max(len(spoken), 1)
        words = [Word(f" {w}", i * step, (i + 1) * step, 1.0) for i, w in enumerate(spoken)]
        segment = Segment(
            id=0,
            seek=0,
            start=0.0,
            end=duration,
            text=f" {self.settings.text}",
            tokens=[],
            temperature=request.temperature,
            avg_logprob=0.0,
            compression_ratio=1.0,
            no_speech_prob=0.0,
            words=words if request.word_timestamps else None,
        )
        return FileTranscript(self.settings.text, "en", duration, [segment] if spoken else [])
