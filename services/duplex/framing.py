"""Audio between a client's framing and rate and the model's 80 ms frames at 24 kHz."""

from __future__ import annotations

import numpy as np

from services.common.audio.pcm import AudioF32
from services.common.audio.polyphase import PolyphaseResampler


class FrameAssembler:
    """Audio of any length in, whole model frames out (the rest waits for more)."""

    def __init__(self, frame_samples: int) -> None:
        self.frame_samples = frame_samples
        self._pending = np.zeros(0, np.float32)

    def push(self, audio: AudioF32) -> list[AudioF32]:
        """The whole frames `audio` completes, in order."""
        joined = np.concatenate([self._pending, audio.astype(np.float32, copy=False)])
        whole = joined.size // self.frame_samples * self.frame_samples
        self._pending = joined[whole:]
        step = self.frame_samples
        return [joined[start : start + step].copy() for start in range(0, whole, step)]

    @property
    def pending(self) -> int:
        """Samples waiting for the rest of their frame."""
        return int(self._pending.size)


class ClientAudio:
    """A client's input: its rate resampled to the model's, cut into model frames."""

    def __init__(self, client_rate: int, model_rate: int, frame_samples: int) -> None:
        self._resampler = PolyphaseResampler(client_rate, model_rate)
        self._frames = FrameAssembler(frame_samples)

    def push(self, audio: AudioF32) -> list[AudioF32]:
        return self._frames.push(self._resampler.process(audio))
