"""A conversation on one WebSocket: the client's inputs, the turn hold, history and replies.

The `Session` dispatches the client's typed inputs (its channel's codec made them), routes
bus results to its `Hearing` (services/gateway/hearing.py: VAD, partials, speculation,
the pause policy, ASR jobs) or to the `Reply` they answer (services/gateway/reply.py:
agent text, TTS jobs, playout), holds a finished turn while the end-of-turn policy waits
for more speech, and keeps the history. Bus results arrive through an inbox, so one slow
client never stalls the gateway's result reader. Every task the session starts lives in
the connection's task group and is cancelled with it.

Everything a session needs (tenant above all, its meter and its history) is given when
it is built; nothing is patched on afterwards.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from services.common.audio.listener import Listener
from services.common.auth.limits import AudioMeter
from services.common.bus.messages import AsrResult, BusResult, JobFailed, TtsChunk, TtsDone
from services.common.errors import InvalidMessage, VoiceAgentError
from services.common.protocol.events import (
    ConversationText,
    ConversationToolResult,
    InputAudioClear,
    InputAudioCommit,
    ResponseCancel,
    ResponseCreate,
    SessionClose,
    SessionConfig,
    SessionUpdate,
    SessionUpdated,
    SpeechStarted,
    SpeechStopped,
    TranscriptFinal,
    TranscriptPartial,
)
from services.gateway import metrics
from services.gateway.agent import (
    Agent,
    ClientTools,
    Turn,
    agent_stream,
    can_prepare,
    reply_turns,
)
from services.gateway.bus import GatewayBus
from services.gateway.codec import AudioIn, ClientInput, SessionChannel
from services.gateway.hearing import Hearing, Utterance
from services.gateway.reply import Reply, ReplyContext, Status, TextSource
from services.gateway.settings import GatewaySection
from services.gateway.store import SessionStore
from services.gateway.turn_end import EndOfTurn, Heard

log = logging.getLogger(__name__)


class SessionClosed(Exception):
    """The client asked to close the session."""


@dataclass(frozen=True)
class SessionServices:
    """What every session of a gateway shares: the bus, the store, the agents and the
    turn policy, its settings and its clock."""

    bus: GatewayBus
    settings: GatewaySection
    agents: dict[str, Callable[[], Agent]]
    end_of_turn: EndOfTurn
    store: SessionStore | None = None
    clock: Callable[[], float] = time.monotonic


@dataclass
class _Prepared:
    """A reply started on a pause's speculative transcript, held back until the turn ends."""

    reply: Reply
    utterance_id: str
    text: str
    """The user's words it answers."""
    history: int
    """How many turns the history had before them."""


@dataclass
class _Held:
    """A user turn the end-of-turn policy is holding on: the user may go on."""

    utterance_id: str
    speech_end_at: float
    timer: asyncio.TimerHandle | None  # None once the user spoke again


class Session:
    """One conversation on one WebSocket."""

    def __init__(
        self,
        config: SessionConfig,
        channel: SessionChannel,
        listener: Listener,
        services: SessionServices,
        tasks: asyncio.TaskGroup,
        *,
        tenant: str,
        meter: AudioMeter,
        history: list[Turn],
    ) -> None:
        self.config = config
        self.channel = channel
        self.services = services
        self.settings = services.settings
        self.bus = services.bus
        self.clock = services.clock
        self.tasks = tasks
        self.tenant = tenant
        """Whose session it is: its jobs carry it, its audio counts against its quota."""
        self.meter = meter
        self.history = history
        self.inbox: asyncio.Queue[tuple[BusResult, bytes | None, float]] = asyncio.Queue(
            self.settings.inbox_size
        )
        self.reply: Reply | None = None
        self._prepared: _Prepared | None = None
        self._held: _Held | None = None
        self._children: set[asyncio.Task[None]] = set()
        self.hearing = Hearing(
            config,
            listener,
            self.bus,
            self.settings,
            services.end_of_turn,
            self,
            tenant=tenant,
            spawn=self._spawn,
            clock=self.clock,
        )
        self._replies = ReplyContext(
            channel, self.bus, self.settings, tenant, self._spawn, self.clock, self._reply_ended
        )

    # ------------------------------------------------------------------ client inputs

    async def serve(self) -> None:
        """Read client inputs until the client leaves or closes the session."""
        self._spawn(self._process_inbox(), "inbox")
        try:
            while True:
                for item in await self.channel.receive():
                    try:
                        await self._on_input(item)
                    except SessionClosed:
                        await self.channel.close(1000, "session closed")
                        return
                    except VoiceAgentError as exc:
                        if exc.fatal:
                            raise
                        await self.channel.send_error(exc)
        finally:
            await self._stop()

    async def _on_input(self, item: ClientInput) -> None:
        match item:
            case AudioIn():
                await self.meter.add_pcm16(len(item.pcm), self.config.input_sample_rate)
                await self.hearing.hear(item.pcm)
            case SessionUpdate():
                await self._update(item)
            case InputAudioCommit():
                await self.hearing.commit()
            case InputAudioClear():
                self.hearing.clear()
            case ConversationText():
                await self._user_turn(item.text)
                await self._start_reply(None, None)
            case ResponseCreate():
                await self._start_reply(None, None, fixed_text=item.text)
            case ResponseCancel():
                await self._cancel_reply()
            case SessionClose():
                raise SessionClosed
            case ConversationToolResult():
                await self._tool_result(item)

    async def _update(self, message: SessionUpdate) -> None:
        patch = message.session.model_dump(exclude_none=True)
        if "agent" in patch and patch["agent"] not in self.services.agents:
            known = ", ".join(sorted(self.services.agents))
            raise InvalidMessage(f"unknown agent {patch['agent']!r}; choose one of {known}")
        if "input_sample_rate" in patch:
            self.hearing.set_input_rate(patch["input_sample_rate"])
        self.config = SessionConfig.model_validate({**self.config.model_dump(), **patch})
        self.hearing.config = self.config
        if "turn_detection" in patch:
            self.hearing.set_turn_detection(self.config.turn_detection)
        await self.channel.send(SessionUpdated(session=self.config))
        await self._save()

    def deliver(self, result: BusResult, audio: bytes | None) -> None:
        """A bus result for this session (called by the gateway's result reader)."""
        try:
            self.inbox.put_nowait((result, audio, self.clock()))
        except asyncio.QueueFull:
            log.error("session %s inbox full: result dropped", self.config.id)

    # ------------------------------------------------------------------ hearing's reports

    def speaking(self) -> bool:
        return self.reply is not None and self.reply.speaking

    async def speech_started(self, utterance_id: str, start_ms: int) -> None:
        await self.channel.send(SpeechStarted(utterance_id=utterance_id, audio_start_ms=start_ms))
        if self._held is not None and self._held.timer is not None:
            self._held.timer.cancel()  # the user goes on: wait for the rest
            self._held.timer = None

    async def speech_stopped(self, utterance_id: str, end_ms: int) -> None:
        await self.channel.send(SpeechStopped(utterance_id=utterance_id, audio_end_ms=end_ms))

    async def barged_in(self) -> None:
        await self._cancel_reply()

    async def partial(self, utterance_id: str, text: str) -> None:
        await self.channel.send(TranscriptPartial(utterance_id=utterance_id, text=text))

    async def pause_heard(self, utterance_id: str, heard: Heard) -> None:
        """The speculative transcript of a pause: prepare the reply to it, held back."""
        await self._discard_prepared()
        if not self.settings.prepare_replies or not heard.text.strip():
            return
        if self.reply is not None or self._held is not None:
            return  # the agent is speaking, or an earlier turn is held: not a fresh turn
        agent = self.services.agents[self.config.agent]()
        if not can_prepare(agent):  # one written before the flag: text only
            return
        history = [*self.history, Turn("user", heard.text)]
        source = _respond(agent, history, self.config.instructions, self._tools())
        reply = Reply(self._replies, self.config, source, self.config.agent, utterance_id)
        self._prepared = _Prepared(reply, utterance_id, heard.text, len(self.history))
        await reply.start(held=True)

    async def speech_resumed(self, utterance_id: str) -> None:
        await self._discard_prepared()  # the user went on: what was prepared is not the answer

    async def transcript(self, utterance: Utterance, text: str) -> None:
        await self.channel.send(
            TranscriptFinal(
                utterance_id=utterance.id,
                text=text,
                audio_start_ms=utterance.start_ms,
                audio_end_ms=utterance.end_ms,
            )
        )
        if text.strip():
            await self._user_said(text, utterance.id, utterance.speech_end_at)
        else:
            await self._release_held()  # the user made a sound but said nothing more

    async def asr_failed(self, error: VoiceAgentError) -> None:
        await self.channel.send_error(error)
        await self._release_held()

    # ------------------------------------------------------------------ the turn hold

    async def _user_said(self, text: str, utterance_id: str, speech_end_at: float) -> None:
        """A transcript ends the user's turn, unless the end-of-turn policy holds on."""
        held = self._drop_held()
        if held is not None and held.timer is None and self.history:
            metrics.TURN_HOLDS.labels("continued").inc()
            last = self.history[-1]
            self.history[-1] = Turn("user", f"{last.text} {text}")  # one turn, two breaths
            await self._save()
        else:
            await self._user_turn(text)
        policy = self.services.end_of_turn
        hold_ms = await policy.hold_ms(list(self.history), self.history[-1].text)
        if hold_ms <= 0:
            await self._start_reply(utterance_id, speech_end_at)
            return
        timer = asyncio.get_running_loop().call_later(hold_ms / 1000, self._hold_expired)
        self._held = _Held(utterance_id, speech_end_at, timer)

    def _drop_held(self) -> _Held | None:
        """Forget the held turn, its timer stopped; returns it."""
        held, self._held = self._held, None
        if held is not None and held.timer is not None:
            held.timer.cancel()
        return held

    def _hold_expired(self) -> None:
        metrics.TURN_HOLDS.labels("expired").inc()
        self._spawn(self._release_held(), "hold-expired")

    async def _release_held(self) -> None:
        """Answer the held turn now (its hold ran out, or what followed had no words)."""
        held = self._drop_held()
        if held is not None:
            await self._start_reply(held.utterance_id, held.speech_end_at)

    # ------------------------------------------------------------------ history

    async def _user_turn(self, text: str) -> None:
        self.history.append(Turn("user", text))
        await self._save()

    async def _save(self) -> None:
        if self.services.store is not None:
            await self.services.store.save(self.config, self.history, self.tenant)

    # ------------------------------------------------------------------ replies

    async def _start_reply(
        self, utterance_id: str | None, speech_end_at: float | None, fixed_text: str | None = None
    ) -> None:
        await self._cancel_reply()
        self._drop_held()  # a reply now supersedes the held turn
        prepared, self._prepared = self._prepared, None
        if fixed_text is None and prepared is not None and self._answers(prepared, utterance_id):
            metrics.PREPARED_REPLIES.labels("used").inc()
            metrics.PREPARED_TTS_SECONDS.labels("used").inc(prepared.reply.audio_seconds)
            self.reply = prepared.reply
            await prepared.reply.release(utterance_id, speech_end_at)
            return
        await self._discard(prepared)
        if fixed_text is not None:
            source, agent = _fixed(fixed_text), None
        else:
            source, agent = self._agent_source(), self.config.agent
        reply = Reply(self._replies, self.config, source, agent, utterance_id, speech_end_at)
        self.reply = reply
        await reply.start()

    def _agent_source(self) -> TextSource:
        """The session's agent on the history as it is now (a snapshot)."""
        agent = self.services.agents[self.config.agent]()
        return _respond(agent, list(self.history), self.config.instructions, self._tools())

    def _tools(self) -> ClientTools:
        return ClientTools(tuple(self.config.tools or ()), self.config.tool_choice or "auto")

    def _answers(self, prepared: _Prepared, utterance_id: str | None) -> bool:
        """Whether a prepared reply answers the turn that just ended: the same utterance,
        the same words, on the same history (nothing else was said since)."""
        return (
            prepared.utterance_id == utterance_id
            and prepared.history == len(self.history) - 1
            and self.history[-1] == Turn("user", prepared.text)
        )

    async def _discard_prepared(self) -> None:
        prepared, self._prepared = self._prepared, None
        await self._discard(prepared)

    async def _discard(self, prepared: _Prepared | None) -> None:
        if prepared is not None:
            metrics.PREPARED_REPLIES.labels("discarded").inc()
            await prepared.reply.discard()
            metrics.PREPARED_TTS_SECONDS.labels("discarded").inc(prepared.reply.audio_seconds)

    async def _tool_result(self, result: ConversationToolResult) -> None:
        """A client tool's output joins the history; the client's `response.create` next
        lets the agent answer with it."""
        pending = self.reply.tool_turns if self.reply is not None else []
        calls = {c.id for turn in [*self.history, *pending] for c in turn.tool_calls}
        if result.call_id not in calls:
            raise InvalidMessage(f"no function call {result.call_id!r} in this conversation")
        self.history.append(Turn("tool", result.output, call_id=result.call_id))
        await self._save()

    async def _cancel_reply(self) -> None:
        reply, self.reply = self.reply, None
        if reply is not None:
            await reply.cancel()

    async def _reply_ended(self, reply: Reply, status: Status, text: str) -> None:
        """A reply ended: the agent's turn is what the user heard of it."""
        if self.reply is reply:
            self.reply = None
        turns = reply_turns(text if status in ("completed", "cancelled") else "", reply.tool_turns)
        if turns:
            self.history += turns
            await self._save()

    # ------------------------------------------------------------------ bus results

    async def _process_inbox(self) -> None:
        while True:
            result, audio, delivered_at = await self.inbox.get()
            await self._on_result(result, audio)
            metrics.RESULTS_WAIT.record(self.clock() - delivered_at)

    async def _on_result(self, result: BusResult, audio: bytes | None) -> None:
        match result:
            case AsrResult():
                await self.hearing.on_result(result)
            case TtsChunk():
                reply = self._reply_of(result.response_id)
                if reply is None:
                    metrics.STALE_DROPPED.labels("tts_chunk").inc()
                else:
                    reply.on_chunk(result, audio)
            case TtsDone():
                reply = self._reply_of(result.response_id)
                if reply is not None:
                    reply.on_done(result)
            case JobFailed() if result.response_id is not None:
                reply = self._reply_of(result.response_id)
                if reply is not None:
                    await reply.on_failed(result)
            case JobFailed():
                await self.hearing.on_failed(result)

    def _reply_of(self, response_id: str) -> Reply | None:
        """The reply playing, or the one prepared, that a TTS result belongs to."""
        prepared = self._prepared.reply if self._prepared is not None else None
        for reply in (self.reply, prepared):
            if reply is not None and reply.id == response_id:
                return reply
        return None

    # ------------------------------------------------------------------ tasks

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = self.tasks.create_task(coro, name=f"{self.config.id}-{name}")
        self._children.add(task)
        task.add_done_callback(self._children.discard)
        return task

    async def _stop(self) -> None:
        self._drop_held()
        self.hearing.stop()
        if self._prepared is not None:
            await self._prepared.reply.stop()
        if self.reply is not None:
            await self.reply.stop()
        for task in list(self._children):
            task.cancel()


def _respond(
    agent: Agent, history: list[Turn], instructions: str | None, tools: ClientTools
) -> TextSource:
    return lambda: agent_stream(agent, history, instructions, tools)


def _fixed(text: str) -> TextSource:
    async def say() -> AsyncIterator[str]:
        yield text

    return say
