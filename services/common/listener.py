"""A client's microphone, heard: PCM16 frames → 16 kHz → Silero VAD → turn events.

Shared by the gateway (`/v1/stream`) and the ASR service (`/v1/stream/asr`).
"""

from __future__ import annotations

import numpy as np

from services.common.audio import AudioF32, StreamResampler, check_sample_rate, pcm16_to_float
from services.common.errors import FrameTooBig
from services.common.turns import SpeechEnd, TurnEvent, TurnSegmenter
from services.common.vad import SileroVad, VadSettings

VAD_RATE = 16000


class Listener:
    """Per-connection VAD and turn segmentation at any allowed input rate."""

    def __init__(self, vad: SileroVad, settings: VadSettings, input_rate: int) -> None:
        self.vad = vad
        self.settings = settings
        self.segmenter = TurnSegmenter(settings)
        self._stream = vad.new_stream()
        self.input_rate = check_sample_rate(input_rate)
        self._resampler = StreamResampler(self.input_rate, VAD_RATE)

    def set_input_rate(self, rate: int) -> None:
        """Switch the input rate (between frames)."""
        if check_sample_rate(rate) != self.input_rate:
            self.input_rate = rate
            self._resampler = StreamResampler(rate, VAD_RATE)

    def max_frame_bytes(self) -> int:
        """The largest audio frame the contract allows: one second at the input rate."""
        return 2 * self.input_rate

    def push(self, pcm: bytes) -> list[TurnEvent]:
        """Hear one frame. InvalidAudio for odd lengths; FrameTooBig above one second."""
        if len(pcm) > self.max_frame_bytes():
            raise FrameTooBig(
                f"audio frame of {len(pcm)} bytes is longer than 1 s at {self.input_rate} Hz"
            )
        samples = self._resampler.process(pcm16_to_float(pcm))
        return self.hear(samples)

    def hear(self, samples: AudioF32) -> list[TurnEvent]:
        """Hear 16 kHz samples directly."""
        if samples.size == 0:
            return []
        probs = self._stream.push(samples.astype(np.float32, copy=False))
        return self.segmenter.feed(samples, probs)

    def partial_due(self, last_partial_ms: int, interval_ms: int) -> bool:
        """Whether the open utterance is due a partial transcript.

        Only while the user is actually speaking: once trailing silence starts the turn
        may be ending, and the model stays free for the final. `interval_ms` 0: never.
        """
        segmenter = self.segmenter
        return (
            interval_ms > 0
            and segmenter.in_speech
            and segmenter.trailing_silence_ms == 0
            and segmenter.position_ms - last_partial_ms >= interval_ms
        )

    def commit(self) -> SpeechEnd | None:
        """End the current utterance now (push-to-talk)."""
        return self.segmenter.flush()

    def clear(self) -> None:
        """Drop buffered audio."""
        self.segmenter.reset()
