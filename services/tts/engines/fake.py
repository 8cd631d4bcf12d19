"""The `fake` TTS engine: no model, an instant quiet tone as long as the text would take.

Audio still travels the whole way (synthesizer, Redis, gateway, pacing), so a stack
running it measures what the gateway and the bus add. The tone is quiet but not
silence, so a client can tell audio arrived; `first_chunk_latency_ms` simulates an
engine of known time-to-first-audio.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import numpy as np

from services.common.audio.pcm import ms_to_samples
from services.tts.engines.base import AudioF32, LibraryVoice, SpeechRequest
from services.tts.settings import FakeTtsSettings

_FADE_MS = 5
"""Fade in and out at the ends, so the tone starts and stops without a click."""


class FakeTtsEngine:
    """A tone of `ms_per_word` per word, in chunks of `chunk_ms`; speaks any voice name."""

    name = "fake"
    model = "fake"
    device = "cpu"
    default_voice = "fake"

    def __init__(
        self,
        settings: FakeTtsSettings,
        chunk_ms: int = 200,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings
        self._sleep = sleep
        """How the first chunk's latency is paid (a test passes its own, to count it)."""
        self.sample_rate = settings.sample_rate
        self._chunk = max(1, ms_to_samples(chunk_ms, self.sample_rate))
        self._peak = np.float32(10 ** (settings.level_dbfs / 20))

    def load(self) -> None:
        """Nothing to load."""

    def voices(self) -> list[str]:
        return [self.default_voice]

    def has_voice(self, voice: str) -> bool:
        """Any name: every voice is the same tone (a client's voice choice never fails)."""
        return bool(voice)

    def library_voice(self, voice: LibraryVoice) -> str:
        return self.default_voice

    def prepare_voice(self, voice: str) -> None:
        """Nothing to prepare."""

    def forget_voice(self, voice: str) -> None:
        """Nothing cached."""

    def duration_samples(self, text: str, speed: float = 1.0) -> int:
        """How long `text` lasts: `ms_per_word` per word, divided by `speed`."""
        words = len(text.split())
        return ms_to_samples(words * self.settings.ms_per_word / speed, self.sample_rate)

    def synthesize(self, request: SpeechRequest) -> Iterator[AudioF32]:
        total = self.duration_samples(request.text, max(request.speed, 0.01))
        return self._stream(total, request.should_stop) if total else iter(())

    def _stream(self, total: int, should_stop: Callable[[], bool] | None) -> Iterator[AudioF32]:
        if self.settings.first_chunk_latency_ms > 0:
            self._sleep(self.settings.first_chunk_latency_ms / 1000)
        for start in range(0, total, self._chunk):
            if should_stop is not None and should_stop():
                return
            yield self._tone(start, min(start + self._chunk, total), total)

    def _tone(self, start: int, end: int, total: int) -> AudioF32:
        """Samples [start, end) of a `total`-sample tone with faded ends."""
        index = np.arange(start, end)
        wave = np.sin(2 * np.pi * self.settings.tone_hz / self.sample_rate * index)
        fade = max(1, ms_to_samples(_FADE_MS, self.sample_rate))
        envelope = np.clip(np.minimum(index + 1, total - index) / fade, 0.0, 1.0)
        samples: AudioF32 = (self._peak * wave * envelope).astype(np.float32)
        return samples
