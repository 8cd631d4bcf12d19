"""The `fake` duplex engine: an echo with text, no model and no torch.

It stands where Moshi would, so the service (slots, batching, admission, both WebSocket
protocols) and whatever sits in front of it can be run and measured anywhere: each
active slot answers with its previous frame scaled by `gain`, and a text piece every
`text_every` frames. Slots are independent and reset like the real engine's.
"""

from __future__ import annotations

import time

import numpy as np

from services.duplex.engines.base import AudioF32, SlotOutput, StepInput, StepOutput
from services.duplex.settings import FakeDuplexSettings

SAMPLE_RATE = 24000
FRAME_SAMPLES = 1920


class FakeDuplexEngine:
    """An echo one frame late; text `" w<n>"` every `text_every` frames of a slot."""

    name = "fake"
    model = "echo"
    device = "cpu"
    sample_rate = SAMPLE_RATE
    frame_samples = FRAME_SAMPLES

    def __init__(self, settings: FakeDuplexSettings) -> None:
        self._settings = settings
        self._previous = np.zeros((0, FRAME_SAMPLES), np.float32)
        self._frames = np.zeros(0, np.int64)
        self.steps = 0
        """Steps run (tests read it)."""

    def load(self, slots: int) -> None:
        self._previous = np.zeros((slots, FRAME_SAMPLES), np.float32)
        self._frames = np.zeros(slots, np.int64)

    def step(self, batch: StepInput) -> StepOutput:
        if self._settings.step_ms:
            time.sleep(self._settings.step_ms / 1000)
        self._previous[batch.reset] = 0.0
        self._frames[batch.reset] = 0
        out: list[SlotOutput | None] = []
        for slot, active in enumerate(batch.active):
            out.append(self._slot(slot, batch.audio[slot]) if active else None)
        self.steps += 1
        return StepOutput(out)

    def _slot(self, slot: int, frame: AudioF32) -> SlotOutput:
        echo = (self._previous[slot] * self._settings.gain).astype(np.float32)
        self._previous[slot] = frame
        self._frames[slot] += 1
        count = int(self._frames[slot])
        text = f" w{count}" if count % self._settings.text_every == 0 else None
        return SlotOutput(audio=echo, text=text)

    def state_bytes_per_slot(self) -> int:
        return FRAME_SAMPLES * 4 + 8
