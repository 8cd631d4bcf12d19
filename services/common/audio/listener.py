"""A client's microphone, heard: PCM16 frames → 16 kHz → Silero VAD → turn events.

Shared by the gateway (`/v1/stream`) and the ASR service (`/v1/stream/asr`).
"""

from __future__ import annotations

import numpy as np

from services.common.audio.pcm import AudioF32, check_sample_rate, pcm16_to_float
from services.common.audio.polyphase import PolyphaseResampler
from services.common.audio.turns import SpeechEnd, TurnEvent, TurnSegmenter
from services.common.audio.vad import SileroVad, VadSettings, VadStream
from services.common.batching import MicroBatcher
from services.common.errors import FrameTooBig, InvalidAudio

VAD_RATE = 16000


def to_vad_rate(rate: int) -> PolyphaseResampler:
    """The resampler of an input rate: the low-delay polyphase filter (1-4 ms of group
    delay). soxr's stream resampler hands its output out in blocks and held back the end
    of the speech for 20 ms (p50) to 40 ms (p95) at 24 and 48 kHz and up to 100 ms at
    8 kHz, every turn (benchmarks/input_resampling.py)."""
    return PolyphaseResampler(rate, VAD_RATE)


_NO_PROBS = np.zeros(0, dtype=np.float32)


class HearingBatcher:
    """The VAD of many listeners, continuously batched (services/common/batching.py): one
    batched model call per window depth for every stream waiting. A stream is only ever
    in one batch: its session waits for the result before it hears its next frame. A
    frame that completes no 32 ms window skips the model (and the wait) altogether."""

    def __init__(self, vad: SileroVad) -> None:
        self.vad = vad
        self._batcher: MicroBatcher[VadStream, AudioF32] = MicroBatcher(vad.process_many, "vad")

    @property
    def calls(self) -> int:
        return self._batcher.calls

    @property
    def streams_run(self) -> int:
        return self._batcher.items_run

    async def hear(self, listener: Listener, samples: AudioF32) -> list[TurnEvent]:
        listener.stream.append(samples)
        if listener.stream.pending_windows == 0:  # no window complete: nothing for the model
            return listener.segmenter.feed(samples, _NO_PROBS)
        # fed even when its caller went away: the segmenter stays in step with the VAD
        return await self._batcher.submit_then(
            listener.stream, lambda probs: listener.segmenter.feed(samples, probs)
        )

    def close(self) -> None:
        self._batcher.close()


class Listener:
    """Per-connection VAD and turn segmentation at any allowed input rate."""

    def __init__(
        self,
        vad: SileroVad,
        settings: VadSettings,
        input_rate: int,
        batcher: HearingBatcher | None = None,
    ) -> None:
        self.vad = vad
        self.settings = settings
        self.segmenter = TurnSegmenter(settings)
        self.stream = vad.new_stream()
        self.batcher = batcher
        self.input_rate = check_sample_rate(input_rate)
        self._resampler = to_vad_rate(self.input_rate)

    def set_input_rate(self, rate: int) -> None:
        """Switch the input rate (between frames)."""
        if check_sample_rate(rate) != self.input_rate:
            self.input_rate = rate
            self._resampler = to_vad_rate(rate)

    def set_turns(self, settings: VadSettings, auto_end: bool = True) -> None:
        """Per-session turn ending: these VAD settings; `auto_end` False ends turns only
        when the caller says (a manual commit)."""
        self.segmenter.reconfigure(settings, auto_end=auto_end)

    def max_frame_bytes(self) -> int:
        """The largest audio frame the contract allows: one second at the input rate."""
        return 2 * self.input_rate

    def push(self, pcm: bytes) -> list[TurnEvent]:
        """Hear one frame. InvalidAudio for empty or odd lengths; FrameTooBig above one second."""
        return self.hear(self._to_vad_rate(pcm))

    async def push_batched(self, pcm: bytes) -> list[TurnEvent]:
        """As `push`, with the VAD run by the batcher together with other listeners'."""
        samples = self._to_vad_rate(pcm)
        if self.batcher is None or samples.size == 0:
            return self.hear(samples)
        return await self.batcher.hear(self, samples)

    def _to_vad_rate(self, pcm: bytes) -> AudioF32:
        if not pcm:
            raise InvalidAudio("an audio frame must hold at least one sample; this one is empty")
        if len(pcm) > self.max_frame_bytes():
            raise FrameTooBig(
                f"audio frame of {len(pcm)} bytes is longer than 1 s at {self.input_rate} Hz"
            )
        return self._resampler.process(pcm16_to_float(pcm))

    def hear(self, samples: AudioF32) -> list[TurnEvent]:
        """Hear 16 kHz samples directly."""
        if samples.size == 0:
            return []
        probs = self.stream.push(samples.astype(np.float32, copy=False))
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
