"""A client's microphone, heard: PCM16 frames → 16 kHz → Silero VAD → turn events.

Shared by the gateway (`/v1/stream`) and the ASR service (`/v1/stream/asr`).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from services.common.audio.pcm import AudioF32, StreamResampler, check_sample_rate, pcm16_to_float
from services.common.audio.turns import SpeechEnd, TurnEvent, TurnSegmenter
from services.common.audio.vad import SileroVad, VadSettings, VadStream
from services.common.errors import FrameTooBig, InvalidAudio

VAD_RATE = 16000


_Waiting = tuple["Listener", AudioF32, asyncio.Future[list[TurnEvent]]]
_NO_PROBS = np.zeros(0, dtype=np.float32)


class HearingBatcher:
    """Continuous batching for the VAD of many listeners, off the event loop.

    Each session's `hear` appends its audio and waits. Whenever the model thread is
    free it takes every listener waiting and runs `SileroVad.process_many` on all of
    them (one batched model call per window depth); frames that arrive meanwhile form
    the next batch, so batches grow with the load and nothing waits on a timer. The
    model runs in its own thread (onnxruntime releases the GIL), so the event loop
    keeps serving sockets during a large batch. A stream is only ever in one batch:
    its session waits for the result before it hears its next frame. A frame that
    completes no 32 ms window skips the model (and the wait) altogether.
    """

    def __init__(self, vad: SileroVad) -> None:
        self.vad = vad
        self._waiting: list[_Waiting] = []
        self._busy = False
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="vad")
        self.calls = 0
        self.streams_run = 0

    async def hear(self, listener: Listener, samples: AudioF32) -> list[TurnEvent]:
        listener.stream.append(samples)
        if listener.stream.pending_windows == 0:  # no window complete: nothing for the model
            return listener.segmenter.feed(samples, _NO_PROBS)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[TurnEvent]] = loop.create_future()
        self._waiting.append((listener, samples, future))
        if not self._busy:
            self._busy = True
            loop.call_soon(self._start)  # after this loop turn: its frames join the batch
        return await future

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _start(self) -> None:
        waiting, self._waiting = self._waiting, []
        streams: list[VadStream] = [listener.stream for listener, _, _ in waiting]
        loop = asyncio.get_running_loop()
        run = loop.run_in_executor(self._executor, self.vad.process_many, streams)
        run.add_done_callback(lambda done: self._finish(waiting, done))

    def _finish(self, waiting: list[_Waiting], run: asyncio.Future[list[AudioF32]]) -> None:
        if self._waiting:
            self._start()  # the next batch goes to the model before this one is handed out
        else:
            self._busy = False
        try:
            probs = run.result()
        except Exception as exc:
            for _, _, future in waiting:
                if not future.done():
                    future.set_exception(exc)
            return
        self.calls += 1
        self.streams_run += len(waiting)
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
