"""`WS /v1/stream/asr`: VAD-segmented streaming transcription (docs/protocol.md).

Speculative finals: at a pause (`VA_VAD__PAUSE_MS`, before the silence that ends a segment)
the audio so far goes to the model at once. If the segment then ends with no more speech,
that transcription is the segment's final (the same audio, so the same text), and the wait
for it overlapped the rest of the silence; if the user went on, it is dropped (counted
as wasted in `va_asr_speculative_total`).

Finals go out in segment order through one sender per connection, and at most
`MAX_PENDING_FINALS` of them wait at a time: a `commit` beyond that is refused with a
non-fatal `capacity` error (nothing changes), a segment the VAD ends beyond it gets that
error instead of its final. `speech.started` and errors are sent by the receive loop
itself (partials one at a time): a client that sends but does not read is held back by
TCP, never by the server's memory."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import deque
from dataclasses import dataclass

from fastapi import WebSocket

from services.asr.batcher import Batcher
from services.asr.engines.base import AsrInput, Transcript
from services.asr.metrics import ASR_SPECULATIVE
from services.common.audio.listener import HearingBatcher, Listener
from services.common.audio.pcm import AudioF32
from services.common.audio.turns import SpeechEnd, SpeechPause, SpeechStart, TurnEvent
from services.common.audio.vad import VadSettings
from services.common.auth.credentials import app_subprotocol
from services.common.auth.guard import meter_of
from services.common.auth.limits import NO_METER
from services.common.errors import (
    CapacityError,
    InternalError,
    UnsupportedSampleRate,
    VoiceAgentError,
)
from services.common.protocol.events import (
    ASR_CLIENT_EVENTS,
    AsrClose,
    AsrReady,
    SegmentFinal,
    SegmentPartial,
    SegmentStarted,
    parse,
)
from services.common.service.routes import ServiceState
from services.common.service.ws import Channel, failing_typed

log = logging.getLogger(__name__)

MAX_PENDING_FINALS = 64
"""Finals a connection may have on their way (being transcribed, or waiting for an earlier
one) before a `commit` is refused with `capacity`."""


@dataclass(frozen=True, slots=True)
class _Final:
    """A final on its way: its transcription (None: an empty final, nothing to hear)."""

    segment_id: str
    start_ms: int
    end_ms: int
    work: asyncio.Task[Transcript | VoiceAgentError] | None


class AsrStream:
    """One `/v1/stream/asr` connection."""

    def __init__(
        self,
        channel: Channel,
        batcher: Batcher,
        listener: Listener,
        language: str | None,
        partials: bool,
        partial_interval_ms: int,
        speculate: bool = True,
    ) -> None:
        self.channel = channel
        self.meter = NO_METER
        """The tenant's audio quota (charged as audio arrives)."""
        self.speculate = speculate
        self._speculation: tuple[int, asyncio.Task[Transcript | VoiceAgentError]] | None = None
        """(end_ms, its transcription) of the pause the open segment is in."""
        self.batcher = batcher
        self.listener = listener
        self.language = language
        self.partials = partials
        self.partial_interval_ms = partial_interval_ms
        self.segment_id = ""
        self._partial_task: asyncio.Task[None] | None = None
        self._last_partial_ms = 0
        self._finals: deque[_Final] = deque()
        """The finals on their way, in segment order; the first is the one being sent."""
        self._finals_added = asyncio.Event()
        self._closing = False
        """The client closed: the sender of finals ends once it has sent them all."""

    async def serve(self, tasks: asyncio.TaskGroup) -> None:
        await self.channel.send(AsrReady(sample_rate=self.listener.input_rate))
        tasks.create_task(self._send_finals(), name="asr-finals")
        try:
            while True:
                frame = await self.channel.receive()
                try:
                    if frame.data is not None:
                        await self.meter.add_pcm16(len(frame.data), self.listener.input_rate)
                        events = await self.listener.push_batched(frame.data)
                        await self._on_events(events, tasks)
                        self._maybe_partial(tasks)
                        continue
                    message = parse(ASR_CLIENT_EVENTS, frame.text or "")
                    if isinstance(message, AsrClose):
                        await self._on_end(self.listener.commit(), tasks, last=True)
                        return
                    await self._commit(tasks)
                except VoiceAgentError as exc:
                    if exc.fatal:
                        raise
                    await self.channel.send_error(exc)
        finally:
            self._closing = True
            self._finals_added.set()

    async def _on_events(self, events: list[TurnEvent], tasks: asyncio.TaskGroup) -> None:
        for event in events:
            if isinstance(event, SpeechPause):
                self._speculate(event, tasks)
            elif isinstance(event, SpeechStart):
                self.segment_id = _new_segment_id()
                self._last_partial_ms = event.start_ms
                await self.channel.send(
                    SegmentStarted(segment_id=self.segment_id, start_ms=event.start_ms)
                )
            else:
                await self._on_end(event, tasks)

    async def _commit(self, tasks: asyncio.TaskGroup) -> None:
        """Finalize the open segment; with none, answer with an empty final all the same
        (after the finals still on their way), so a client waiting for one never waits.
        With `MAX_PENDING_FINALS` on their way, refuse it (`capacity`): nothing changes."""
        if self._full():
            await self.channel.send_error(self._refusal("commit refused"), fatal=False)
            return
        end = self.listener.commit()
        if end is not None:
            await self._on_end(end, tasks)
            return
        now = self.listener.segmenter.position_ms
        self._queue(_Final(_new_segment_id(), now, now, None))

    def _speculate(self, pause: SpeechPause, tasks: asyncio.TaskGroup) -> None:
        """Transcribe the paused audio now; an earlier pause's work is wasted."""
        if not self.speculate:
            return
        self._drop_speculation()
        work = tasks.create_task(self._transcribe(pause.audio), name="speculative-final")
        self._speculation = (pause.end_ms, work)

    def _drop_speculation(self) -> None:
        if self._speculation is not None:
            self._speculation[1].cancel()
            self._speculation = None
            ASR_SPECULATIVE.labels("wasted").inc()

    async def _transcribe(self, audio: AudioF32) -> Transcript | VoiceAgentError:
        """The segment's transcript, or the error that lost it (the stream goes on)."""
        try:
            item = AsrInput(audio, self.language, self.listener.input_rate)
            return await self.batcher.transcribe(item)
        except VoiceAgentError as exc:
            return exc
        except Exception as exc:  # the model call failed (CUDA out of memory, a bug)
            log.exception("ASR stream: a segment's transcription failed")
            return InternalError.of(exc)

    async def _on_end(
        self, end: SpeechEnd | None, tasks: asyncio.TaskGroup, last: bool = False
    ) -> None:
        """Queue the segment's final; with `MAX_PENDING_FINALS` on their way it is lost
        (a `capacity` error with its id), unless it is the `last` (the client closes)."""
        if end is None:
            return
        segment_id = self.segment_id or _new_segment_id()
        self.segment_id = ""
        if self._full() and not last:
            self._drop_speculation()
            await self.channel.send_error(
                self._refusal("segment not transcribed"), segment_id, fatal=False
            )
            return
        speculative = None
        if self._speculation is not None and end.ends_pause(self._speculation[0]):
            speculative, self._speculation = self._speculation[1], None
            ASR_SPECULATIVE.labels("used").inc()
        self._drop_speculation()
        work = speculative or tasks.create_task(
            self._transcribe(end.audio), name=f"final-{segment_id}"
        )
        self._queue(_Final(segment_id, end.start_ms, end.end_ms, work))

    def _full(self) -> bool:
        return len(self._finals) >= MAX_PENDING_FINALS

    def _refusal(self, what: str) -> CapacityError:
        return CapacityError(
            f"{what}: {MAX_PENDING_FINALS} finals are already on their way on this "
            "connection; read them first"
        )

    def _queue(self, final: _Final) -> None:
        self._finals.append(final)
        self._finals_added.set()

    async def _send_finals(self) -> None:
        """The one sender of finals: each in segment order once transcribed (a lost
        segment's error in its place). It ends when the client has closed and all are sent."""
        while True:
            if not self._finals:
                if self._closing:
                    return
                self._finals_added.clear()
                await self._finals_added.wait()
                continue
            await self._send_final(self._finals[0])
            self._finals.popleft()

    async def _send_final(self, final: _Final) -> None:
        if final.work is None:
            empty = SegmentFinal(
                segment_id=final.segment_id, text="", start_ms=final.start_ms, end_ms=final.end_ms
            )
            await self.channel.send(empty)
            return
        transcript = await final.work
        if isinstance(transcript, VoiceAgentError):  # this segment is lost; the stream goes on
            await self.channel.send_error(transcript, final.segment_id, fatal=False)
            return
        event = SegmentFinal(
            segment_id=final.segment_id,
            text=transcript.text,
            start_ms=final.start_ms,
            end_ms=final.end_ms,
            language=transcript.language,
        )
        await self.channel.send(event)

    def _maybe_partial(self, tasks: asyncio.TaskGroup) -> None:
        if not (self.partials and self.segment_id):
            return
        if self._partial_task is not None and not self._partial_task.done():
            return  # at most one partial in flight
        if not self.listener.partial_due(self._last_partial_ms, self.partial_interval_ms):
            return
        segmenter = self.listener.segmenter
        self._last_partial_ms = segmenter.position_ms
        audio = AsrInput(segmenter.current_audio(), self.language, self.listener.input_rate)
        self._partial_task = tasks.create_task(self._partial(self.segment_id, audio))

    async def _partial(self, segment_id: str, audio: AsrInput) -> None:
        try:
            transcript = await self.batcher.transcribe(audio, mode="partial")
        except VoiceAgentError:
            return  # partials are droppable
        except Exception:  # the model call failed: the final's own error tells the client
            log.warning("ASR stream: a partial's transcription failed", exc_info=True)
            return
        if segment_id == self.segment_id and transcript.text:
            await self.channel.send(SegmentPartial(segment_id=segment_id, text=transcript.text))


def _new_segment_id() -> str:
    return f"seg_{uuid.uuid4().hex[:12]}"


async def serve_asr_stream(
    ws: WebSocket,
    state: ServiceState,
    batcher: Batcher,
    hearing: HearingBatcher,
    vad_settings: VadSettings,
    max_frame_bytes: int,
    sample_rate: int,
    language: str | None,
    partials: bool,
    speculate: bool = True,
) -> None:
    """Accept and serve one connection; errors map to events and close codes here."""
    await ws.accept(subprotocol=app_subprotocol(ws.scope.get("subprotocols")))
    channel = Channel(ws, "asr", max_frame_bytes)
    state.connection_opened()
    try:
        try:
            listener = Listener(hearing.vad, vad_settings, sample_rate, hearing)
        except UnsupportedSampleRate as exc:
            exc.fatal = True
            exc.close_code = 1008
            await channel.fail(exc)
            return
        stream = AsrStream(channel, batcher, listener, language, partials, 500, speculate)
        stream.meter = meter_of(ws)
        async with failing_typed(channel.fail, "ASR stream"), asyncio.TaskGroup() as tasks:
            await stream.serve(tasks)
        await channel.close(1000)  # nothing when it failed: closed already
    finally:
        state.connection_closed()
