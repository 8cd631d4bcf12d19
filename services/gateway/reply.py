"""One agent reply: its text stream, TTS jobs, paced playout, and what the user heard.

A `Reply` is created for a turn and started: its text (an agent's stream, or a fixed
text) goes out as deltas and, cut into sentence chunks, to TTS; the audio that comes back
is reordered and played at real time plus a lead. A reply can be started *held*: it
prepares everything (agent text, first TTS pieces) but sends nothing to the client until
`release`; `discard` then drops it without a trace (the reply prepared during a pause,
when the user goes on). `cancel` stops a reply the user heard part of (barge-in, a
client's cancel) and returns what was heard.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from services.common.audio.pcm import ms_to_samples
from services.common.bus.messages import JobFailed, TtsChunk, TtsDone, TtsJob
from services.common.errors import AgentFailed, TtsUnavailable, VoiceAgentError
from services.common.protocol.events import (
    AudioEncoding,
    Event,
    OutputAudioClear,
    ResponseAudioDone,
    ResponseCreated,
    ResponseDone,
    ResponseFunctionCall,
    ResponseTextDelta,
    SessionConfig,
)
from services.common.service.waiting import set_within
from services.common.text import ends_sentence
from services.gateway import metrics
from services.gateway.agent import AgentOutput, ToolsAnswered, ToolsCalled, Turn, closing
from services.gateway.bus import GatewayBus
from services.gateway.chunking import Chunker
from services.gateway.hearing import job_error, new_id
from services.gateway.response import ResponseAudio
from services.gateway.settings import GatewaySection
from services.gateway.speech import spoken

log = logging.getLogger(__name__)

Spawn = Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]]
TextSource = Callable[[], AsyncIterator[AgentOutput]]
"""Makes the reply's text stream (an agent's `respond`, or a fixed text)."""
Status = Literal["completed", "failed", "cancelled"]


class Output(Protocol):
    """Where a reply's events and audio go (the session's channel)."""

    async def send(self, event: Event) -> None: ...

    async def send_audio(self, data: bytes, coding: AudioEncoding | None = None) -> None:
        """PCM16 out, coded as `coding` (the reply's own output format)."""
        ...

    async def send_error(self, exc: VoiceAgentError) -> None: ...


@dataclass
class ReplyContext:
    """What every reply of a session needs; given when the session is built."""

    output: Output
    bus: GatewayBus
    settings: GatewaySection
    tenant: str
    spawn: Spawn
    clock: Callable[[], float]
    record: Callable[[Reply, Status, str], Coroutine[Any, Any, None]]
    """Called once when a reply ends, before the client is told (`response.done`): the
    agent's turn is kept (saved) first, so a gateway that dies right after the client saw
    the reply end has not lost it."""
    finished: Callable[[Reply, Status, str], Coroutine[Any, Any, None]]
    """Called once when a reply has ended and its client was told (not when discarded):
    its status and the text the user heard (all of it when completed)."""
    voice_to_voice: Callable[[float], None] = lambda _seconds: None
    """Told the voice-to-voice of each reply that answers speech (seconds)."""
    confirms_playout: bool = False
    """The client reports what has played (Twilio's marks): the user heard that much,
    whatever the clock says."""


@dataclass
class _Playout:
    started: float | None = None
    sent_bytes: int = 0
    first_tts_at: float | None = None
    confirmed_bytes: int = 0
    """What the client said has played (`Reply.played`)."""


@dataclass
class Reply:
    """One reply, from its first text to its last audio byte."""

    ctx: ReplyContext
    config: SessionConfig
    source: TextSource
    agent: str | None = None
    """The agent writing it (None: a fixed text, which has no first-token time)."""
    utterance_id: str | None = None
    speech_end_at: float | None = None
    """Clock time of the end of the user's speech it answers (voice-to-voice from here)."""
    id: str = field(default_factory=lambda: new_id("resp"))
    held: bool = False
    done: bool = False
    cancelled: bool = False
    """It ended before its end (barge-in, a client's cancel, a newer turn)."""
    agent_failed: bool = False
    audio: ResponseAudio = field(init=False)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    playout: _Playout = field(default_factory=_Playout)
    tool_turns: list[Turn] = field(default_factory=list)
    """The agent's tool calls and their results, for the history (before its spoken turn)."""
    _waiting: list[Event | VoiceAgentError] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.audio = ResponseAudio(self.id)

    @property
    def audio_seconds(self) -> float:
        """Seconds of audio the TTS has sent for it so far (its TTS work)."""
        return self.audio.received_bytes / (2 * self.config.output_sample_rate)

    @property
    def speaking(self) -> bool:
        """Its audio is playing at the client (speech over it may barge in)."""
        return not self.done and self.playout.sent_bytes > 0

    # ------------------------------------------------------------------ lifecycle

    async def start(self, held: bool = False) -> None:
        """Produce text and audio; unless `held`, tell the client and play as audio comes."""
        self.held = held
        await self._emit(ResponseCreated(response_id=self.id, utterance_id=self.utterance_id))
        self.tasks.append(self.ctx.spawn(self._produce(), "produce"))
        if not held:
            self.tasks.append(self.ctx.spawn(self._play(), "play"))

    async def release(self, utterance_id: str | None, speech_end_at: float | None) -> None:
        """A held reply goes out: what it prepared is sent, then played."""
        if not self.held or self.done:
            return
        self.held = False
        self.utterance_id, self.speech_end_at = utterance_id, speech_end_at
        waiting, self._waiting = self._waiting, []
        for item in waiting:
            if isinstance(item, ResponseCreated):
                item = item.model_copy(update={"utterance_id": utterance_id})
            await self._emit(item)
        self.tasks.append(self.ctx.spawn(self._play(), "play"))

    async def discard(self) -> None:
        """Drop a held reply: its work stops and nothing of it reaches the client."""
        if self.done:
            return
        self.done = True
        self._waiting.clear()
        self._stop_tasks()
        await self.ctx.bus.cancel(self.id)

    async def cancel(self) -> None:
        """Stop it end to end; the user keeps only what they heard."""
        if self.done:
            return
        if self.held:
            await self.discard()
            return
        self.done = self.cancelled = True
        self._stop_tasks()
        await self.ctx.bus.cancel(self.id)
        heard = self.audio.heard_text(self._heard_bytes())
        await self.ctx.record(self, "cancelled", heard)
        if self.playout.sent_bytes:
            await self.ctx.output.send(OutputAudioClear(response_id=self.id))
        await self.ctx.output.send(
            ResponseDone(response_id=self.id, status="cancelled", text=heard)
        )
        metrics.RESPONSES.labels("cancelled").inc()
        await self.ctx.finished(self, "cancelled", heard)

    async def stop(self) -> None:
        """The session ends: the workers stop this reply's jobs."""
        if not self.done:
            self.done = True
            await self.ctx.bus.cancel(self.id)

    def _stop_tasks(self) -> None:
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()

    async def _emit(self, item: Event | VoiceAgentError) -> None:
        """To the client, or kept until release while held."""
        if self.held:
            self._waiting.append(item)
        elif isinstance(item, VoiceAgentError):
            await self.ctx.output.send_error(item)
        else:
            await self.ctx.output.send(item)

    # ------------------------------------------------------------------ text → TTS

    async def _produce(self) -> None:
        """Text → deltas to the client → sentence chunks → TTS jobs."""
        settings = self.ctx.settings
        chunker = Chunker(
            settings.first_chunk_words,
            language=self.config.language,
            first_chunk_phrase=settings.first_chunk_phrase,
        )
        started = self.ctx.clock() if self.agent is not None else None
        try:
            async with closing(self.source()) as stream:  # a cancel closes the LLM's stream
                async for delta in stream:
                    if started is not None:
                        metrics.AGENT_FIRST_TOKEN.observe(self.ctx.clock() - started)
                        started = None
                    if not isinstance(delta, str):
                        await self._tool_step(delta, chunker)
                    elif delta:
                        await self._emit(ResponseTextDelta(response_id=self.id, delta=delta))
                        for chunk in chunker.feed(delta):  # more text follows each
                            await self._submit_tts(chunk, continues=not ends_sentence(chunk))
        except VoiceAgentError as exc:
            self.agent_failed = True
            await self._emit(exc)
        except Exception as exc:
            self.agent_failed = True
            log.exception("agent %s failed", self.agent)
            await self._emit(AgentFailed(f"the agent failed: {exc}"))
        for chunk in chunker.flush():
            await self._submit_tts(chunk)
        self.audio.finish_text()

    async def _tool_step(self, step: ToolsCalled | ToolsAnswered, chunker: Chunker) -> None:
        """The agent uses tools: what it said so far is spoken now, the calls and results
        join the history, and calls of the client's tools go to the client."""
        for chunk in chunker.flush():
            await self._submit_tts(chunk)
        if isinstance(step, ToolsAnswered):
            self.tool_turns += step.turns()
        elif step.client:
            self.tool_turns.append(Turn("agent", "", tool_calls=step.calls))
            for call in step.calls:
                await self._emit(
                    ResponseFunctionCall(
                        response_id=self.id,
                        call_id=call.id,
                        name=call.name,
                        arguments=call.arguments,
                    )
                )

    async def _submit_tts(self, text: str, continues: bool = False) -> None:
        if self.playout.first_tts_at is None:
            self.playout.first_tts_at = self.ctx.clock()
        seq = self.audio.add_text(text)
        style = self.config.tts
        job = TtsJob(
            job_id=new_id("tts"),
            tenant=self.ctx.tenant,
            session_id=self.config.id,
            response_id=self.id,
            seq=seq,
            text=spoken(text, self.config.language),
            voice=self.config.voice,
            sample_rate=self.config.output_sample_rate,
            reply_to=self.ctx.bus.reply_to,
            exaggeration=style.exaggeration if style else None,
            cfg_weight=style.cfg_weight if style else None,
            temperature=style.temperature if style else None,
            enqueued_at=time.time(),
            continues=continues,
        )
        await self.ctx.bus.submit_tts(job)

    # ------------------------------------------------------------------ TTS results

    def on_chunk(self, result: TtsChunk, audio: bytes | None) -> None:
        if audio is None or self.done or not self.audio.add_audio(result.seq, result.index, audio):
            metrics.STALE_DROPPED.labels("tts_chunk").inc()

    def on_done(self, result: TtsDone) -> None:
        if result.status == "completed" and not self.done:
            self.audio.finish_chunk(result.seq, result.chunks)

    async def on_failed(self, result: JobFailed) -> None:
        if result.seq is not None and not self.done:
            self.audio.finish_chunk(result.seq, 0, failed=True)
            await self._emit(job_error(result, TtsUnavailable))

    # ------------------------------------------------------------------ playout

    async def _play(self) -> None:
        """Send the audio in order, paced at real time plus a lead."""
        rate = self.config.output_sample_rate
        frame_bytes = 2 * ms_to_samples(self.ctx.settings.output_frame_ms, rate)
        pending = b""
        while not self.done:  # stopped (the session ended) or finished elsewhere: no more
            self.audio.changed.clear()
            pcm = self.audio.next_audio()
            if pcm is not None:
                pending += pcm
                while len(pending) >= frame_bytes and not self.done:
                    await self._send_frame(pending[:frame_bytes], rate)
                    pending = pending[frame_bytes:]
                continue
            if self.audio.complete:
                break
            if not await set_within(self.audio.changed, self.ctx.settings.tts_timeout_s):
                await self.ctx.output.send_error(TtsUnavailable("no TTS audio arrived in time"))
                await self._finish("failed")
                return
        if self.done:
            return
        if pending:
            await self._send_frame(pending, rate)
        failed = self.audio.any_failed or self.agent_failed
        await self._finish("failed" if self.playout.sent_bytes == 0 and failed else "completed")

    async def _send_frame(self, frame: bytes, rate: int) -> None:
        now = self.ctx.clock()
        playout = self.playout
        if playout.started is None:
            playout.started = now
            if playout.first_tts_at is not None:
                metrics.TTS_FIRST_AUDIO.observe(now - playout.first_tts_at)
            if self.speech_end_at is not None:
                metrics.VOICE_TO_VOICE.observe(now - self.speech_end_at)
                self.ctx.voice_to_voice(now - self.speech_end_at)
        sent_s = playout.sent_bytes / (2 * rate)
        due = playout.started + sent_s - self.ctx.settings.output_lead_ms / 1000
        if due > now:
            await asyncio.sleep(due - now)
        await self.ctx.output.send_audio(frame, self.config.output_format)
        playout.sent_bytes += len(frame)

    async def _finish(self, status: Status) -> None:
        if self.done:
            return
        self.done = True
        rate = self.config.output_sample_rate
        audio_ms = round(self.playout.sent_bytes * 1000 / (2 * rate))
        text = self.audio.text
        await self.ctx.record(self, status, text)
        await self.ctx.output.send(ResponseAudioDone(response_id=self.id, audio_ms=audio_ms))
        await self.ctx.output.send(ResponseDone(response_id=self.id, status=status, text=text))
        metrics.RESPONSES.labels(status).inc()
        await self.ctx.finished(self, status, text)

    def played(self, played_bytes: int) -> None:
        """The client says its audio has played up to here (a mark came back)."""
        if not self.done:
            confirmed = min(played_bytes, self.playout.sent_bytes)
            self.playout.confirmed_bytes = max(self.playout.confirmed_bytes, confirmed)

    def _heard_bytes(self) -> int:
        """Audio that played at the client: what it confirmed, where it confirms; else sent
        minus what its buffer still held, by the clock."""
        if self.ctx.confirms_playout:
            return self.playout.confirmed_bytes
        if self.playout.started is None:
            return 0
        rate = self.config.output_sample_rate
        played = int((self.ctx.clock() - self.playout.started) * rate) * 2
        return min(self.playout.sent_bytes, played)
