"""A client's microphone, heard: PCM16 frames → 16 kHz → Silero VAD → turn events.

Shared by the gateway (`/v1/stream`) and the ASR service (`/v1/stream/asr`).
"""

from __future__ import annotations

import asyncio

import numpy as np

from services.common.audio import AudioF32, StreamResampler, check_sample_rate, pcm16_to_float
from services.common.errors import FrameTooBig
from services.common.turns import SpeechEnd, TurnEvent, TurnSegmenter
from services.common.vad import SileroVad, VadSettings, VadStream

VAD_RATE = 16000


class HearingBatcher:
    """Runs the VAD of every listener that heard a frame this event-loop turn in one call.

    Frames from many sessions arrive in the same turn of the loop under load; each
    session's `hear` appends its audio and waits, and one callback scheduled after
    them runs `SileroVad.process_many` for all (one batched model call per window
    depth instead of one call per session). No timer: a lone frame waits no longer
    than the rest of the loop turn it arrived in.
    """

    def __init__(self, vad: SileroVad) -> None:
        self.vad = vad
        self._waiting: list[tuple[Listener, AudioF32, asyncio.Future[list[TurnEvent]]]] = []
        self._scheduled = False
        self.calls = 0
        self.streams_run = 0

    async def hear(self, listener: Listener, samples: AudioF32) -> list[TurnEvent]:
        loop = asyncio.get_running_loop()
        listener.stream.append(samples)
        future: asyncio.Future[list[TurnEvent]] = loop.create_future()
        self._waiting.append((listener, samples, future))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._run)
        return await future

    def _run(self) -> None:
        self._scheduled = False
        waiting, self._waiting = self._waiting, []
        streams: list[VadStream] = [listener.stream for listener, _, _ in waiting]
        try:
            probs = self.vad.process_many(streams)
        except Exception as exc:
            for _, _, future in waiting:
                if not future.done():
                    future.set_exception(exc)
            return
        self.calls += 1
        self.streams_run += len(streams)
        for (listener, samples, future), p in zip(waiting, probs, strict=True):
            try:  # fed even when its caller went away: the segmenter stays in step
                events = listener.segmenter.feed(samples, p)
            except Exception as exc:
                if not future.done():
                    future.set_exception(exc)
                continue
            if not future.done():
                future.set_result(events)


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
        return self.hear(self._to_vad_rate(pcm))

    async def push_batched(self, pcm: bytes) -> list[TurnEvent]:
        """As `push`, with the VAD run by the batcher together with other listeners'."""
        samples = self._to_vad_rate(pcm)
        if self.batcher is None:
            return self.hear(samples)
        if samples.size == 0:
            return []
        return await self.batcher.hear(self, samples.astype(np.float32, copy=False))

    def _to_vad_rate(self, pcm: bytes) -> AudioF32:
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
