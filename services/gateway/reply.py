"""One agent reply: its text stream, TTS jobs, paced playout, and what the user heard.

A `Reply` is created for a turn and started: its text (an agent's stream, or a fixed
text) goes out as deltas and, cut into sentence chunks, to TTS; the audio that comes back
is reordered and played at real time plus a lead. A reply can be started *held*: it
prepares everything (agent text, first TTS pieces) but sends nothing to the client until
`release`; `discard` then drops it without a trace (the reply prepared during a pause,
when the user goes on). `cancel` stops a reply the user heard part of (barge-in, a
client's cancel) and returns what was heard; `stop` (the session ends) keeps what was
heard in the history and tells the client nothing.

However it ends, a reply ends once: from then on it sends nothing and starts nothing (a
cancel that lands while `response.created` is being written leaves no agent running), its
tasks stop and its TTS jobs are cancelled; `ended` is set once its client was told.
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
    sent_bytes: int = 0
    anchor: float | None = None
    """When the audio playing now started at the client: the first frame, or the first
    after the client's buffer ran dry (the agent's text paused longer than the audio)."""
    anchor_bytes: int = 0
    """Audio sent before `anchor` (all of it played by then)."""
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
    tool_results: list[Turn] = field(default_factory=list)
    """Results of its client calls that came before it ended: they follow its turns."""
    recorded: bool = False
    """Its turns went to the history (`ReplyContext.record`): a tool result now follows."""
    stopped: bool = False
    """It ended with its session (`stop`): its client was never told."""
    superseded: bool = False
    """It was cancelled for another answer of the agent to the same history (a client's
    `response.create`, or the turn's own answer after one), or for the user's next words:
    what is owed is settled by what follows (the new answer, those words' save)."""
    ended: asyncio.Event = field(init=False)
    """Set once it has ended and its client was told (or it was dropped, or stopped)."""
    _waiting: list[Event | VoiceAgentError] = field(default_factory=list)
    _releasing: bool = False

    def __post_init__(self) -> None:
        self.audio = ResponseAudio(self.id)
        self.ended = asyncio.Event()

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
        """Produce text and audio; unless `held`, tell the client and play as audio comes.
        A reply that ended while its `response.created` was being written starts nothing."""
        self.held = held
        await self._emit(ResponseCreated(response_id=self.id, utterance_id=self.utterance_id))
        if self.done:
            return
        self.tasks.append(self.ctx.spawn(self._produce(), "produce"))
        if not held:
            self.tasks.append(self.ctx.spawn(self._play(), "play"))

    async def release(self, utterance_id: str | None, speech_end_at: float | None) -> None:
        """A held reply goes out: what it prepared is sent, in order (what it makes
        meanwhile queues behind), then played; a cancel meanwhile ends the sending."""
        if not self.held or self.done:
            return
        self.held = False
        self.utterance_id, self.speech_end_at = utterance_id, speech_end_at
        self._releasing = True
        try:
            while self._waiting and not self.done:
                item = self._waiting.pop(0)
                if isinstance(item, ResponseCreated):
                    item = item.model_copy(update={"utterance_id": utterance_id})
                await self._send(item)
        finally:
            self._releasing = False
        if not self.done:
            self.tasks.append(self.ctx.spawn(self._play(), "play"))

    async def discard(self) -> None:
        """Drop a held reply: its work stops and nothing of it reaches the client."""
        if self.done:
            return
        self.done = True
        try:
            self._waiting.clear()
            self._stop_tasks()
            await self.ctx.bus.cancel(self.id)
        finally:
            self.ended.set()

    async def cancel(self) -> None:
        """Stop it end to end; the user keeps only what they heard. Returns once it has
        ended and its client was told, also when it was ending already (elsewhere)."""
        if self.done:
            await self.ended.wait()
            return
        if self.held:
            await self.discard()
            return
        self.done = self.cancelled = True
        try:
            self._stop_tasks()
            # recorded first, with no wait before it: the session may end (and cancel the
            # task running this) while the TTS jobs' cancel waits on Redis
            heard = self.audio.heard_text(self._heard_bytes(), self.config.output_sample_rate)
            await self._record("cancelled", heard)
            await asyncio.shield(self.ctx.bus.cancel(self.id))
            if self.playout.sent_bytes:
                await self.ctx.output.send(OutputAudioClear(response_id=self.id))
            await self.ctx.output.send(
                ResponseDone(response_id=self.id, status="cancelled", text=heard)
            )
            metrics.RESPONSES.labels("cancelled").inc()
            await self.ctx.finished(self, "cancelled", heard)
        finally:
            self.ended.set()

    async def stop(self) -> None:
        """The session ends (its client left, or resumes it on another connection): the
        work and the TTS jobs stop, and a reply its client was answered with is kept as
        cut here (what was heard of it, its tool turns), for the session's last save.
        Nothing is sent."""
        if self.done:
            return
        self.done = self.stopped = True
        try:
            self._stop_tasks()
            if not self.held:
                self.cancelled = True
                rate = self.config.output_sample_rate
                await self._record("cancelled", self.audio.heard_text(self._heard_bytes(), rate))
                metrics.RESPONSES.labels("cancelled").inc()
            await self.ctx.bus.cancel(self.id)
        finally:
            self.ended.set()

    def _stop_tasks(self) -> None:
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()

    async def _record(self, status: Status, text: str) -> None:
        self.recorded = True
        await self.ctx.record(self, status, text)

    async def _emit(self, item: Event | VoiceAgentError) -> None:
        """To the client, or kept until release while held (or while what was kept is
        being sent); nothing once it has ended."""
        if self.done:
            return
        if self.held or self._releasing:
            self._waiting.append(item)
        else:
            await self._send(item)

    async def _send(self, item: Event | VoiceAgentError) -> None:
        if isinstance(item, VoiceAgentError):
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
        # while audio is owed: the TTS progress seen, and when its time runs out (new agent
        # text gives a stalled TTS no more time)
        tts_wait: tuple[tuple[int, int, int | None, bool], float] | None = None
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
            if not self.audio.awaiting_audio:  # the agent's text is late
                tts_wait = None
                idle_s = self.ctx.settings.agent_idle_timeout_s
                if not await set_within(self.audio.changed, idle_s):
                    await self.ctx.output.send_error(
                        AgentFailed(f"the agent said nothing more for {idle_s:g} s")
                    )
                    await self._finish("failed")
                    return
                continue
            now = self.ctx.clock()
            progress = self.audio.head_progress
            if tts_wait is None or tts_wait[0] != progress:
                tts_wait = (progress, now + self.ctx.settings.tts_timeout_s)
            if not await set_within(self.audio.changed, tts_wait[1] - now):
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
        if playout.anchor is None:  # the first frame
            if playout.first_tts_at is not None:
                metrics.TTS_FIRST_AUDIO.observe(now - playout.first_tts_at)
            if self.speech_end_at is not None:
                metrics.VOICE_TO_VOICE.observe(now - self.speech_end_at)
                self.ctx.voice_to_voice(now - self.speech_end_at)
        played_out = self._played_out_at(rate)
        if now >= played_out:  # the first frame, or the client's buffer ran dry
            playout.anchor, playout.anchor_bytes, played_out = now, playout.sent_bytes, now
        due = played_out - self.ctx.settings.output_lead_ms / 1000
        if due > now:
            await asyncio.sleep(due - now)
        await self.ctx.output.send_audio(frame, self.config.output_format)
        playout.sent_bytes += len(frame)

    def _played_out_at(self, rate: int) -> float:
        """When the client will have played all audio sent so far (paced from `anchor`;
        with none sent yet, it has)."""
        playout = self.playout
        if playout.anchor is None:
            return float("-inf")
        return playout.anchor + (playout.sent_bytes - playout.anchor_bytes) / (2 * rate)

    async def _finish(self, status: Status) -> None:
        """It played to its end, or failed: its work stops; the user keeps what was said
        (failed: the audio sent, which plays out at the client, and the tools it ran)."""
        if self.done:
            return
        self.done = True
        try:
            self._stop_tasks()
            rate = self.config.output_sample_rate
            audio_ms = round(self.playout.sent_bytes * 1000 / (2 * rate))
            if status == "completed":
                text = self.audio.text
            else:
                text = self.audio.heard_text(self.playout.sent_bytes, rate)
            await self._record(status, text)
            if status != "completed":  # all audio of a completed one came: no job is left
                await self.ctx.bus.cancel(self.id)
            await self.ctx.output.send(ResponseAudioDone(response_id=self.id, audio_ms=audio_ms))
            await self.ctx.output.send(ResponseDone(response_id=self.id, status=status, text=text))
            metrics.RESPONSES.labels(status).inc()
            await self.ctx.finished(self, status, text)
        finally:
            self.ended.set()

    def played(self, played_bytes: int) -> None:
        """The client says its audio has played up to here (a mark came back)."""
        if not self.done:
            confirmed = min(played_bytes, self.playout.sent_bytes)
            self.playout.confirmed_bytes = max(self.playout.confirmed_bytes, confirmed)

    def _heard_bytes(self) -> int:
        """Audio that played at the client: what it confirmed, where it confirms; else what
        was sent and is due by the clock: each frame plays at its scheduled time, at real
        time from the last time the client's buffer ran dry (`_Playout.anchor`)."""
        if self.ctx.confirms_playout:
            return self.playout.confirmed_bytes
        playout = self.playout
        if playout.anchor is None:
            return 0
        rate = self.config.output_sample_rate
        played = playout.anchor_bytes + int((self.ctx.clock() - playout.anchor) * rate) * 2
        return min(playout.sent_bytes, played)
