"""A conversation on one WebSocket: the client's inputs, the turn hold, history and replies.

The `Session` dispatches the client's typed inputs (its channel's codec made them), routes
bus results to its `Hearing` (services/gateway/hearing.py: VAD, partials, speculation,
the pause policy, ASR jobs) or to the reply they answer (services/gateway/replies.py: the
reply playing, the one prepared during a pause, the turn the end-of-turn policy holds;
each a `Reply`, services/gateway/reply.py: agent text, TTS jobs, playout), and keeps the
history. Bus results arrive through an inbox, so one slow
client never stalls the gateway's result reader. Every task the session starts lives in
the connection's task group and is cancelled with it.

Everything a session needs (tenant above all, its meter and its history) is given when
it is built; nothing is patched on afterwards.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from services.common.audio.listener import Listener
from services.common.auth.limits import AudioMeter
from services.common.bus.messages import AsrResult, BusResult, JobFailed, TtsChunk, TtsDone
from services.common.errors import AgentFailed, InvalidMessage, VoiceAgentError
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
from services.common.service.ws import ReadAhead
from services.gateway import metrics
from services.gateway.agent import Agent, Turn, can_prepare, keep_recent, reply_turns
from services.gateway.bus import GatewayBus
from services.gateway.codec import AudioIn, AudioPlayed, ClientInput, SessionChannel, UserItem
from services.gateway.hearing import Hearing, Utterance
from services.gateway.replies import Replies
from services.gateway.reply import Reply, ReplyContext, Status
from services.gateway.settings import GatewaySection
from services.gateway.store import TAKEN_KEPT, SessionStore, Unheard
from services.gateway.turn_end import EndOfTurn, Heard, word_rules_apply

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
    voice_to_voice: Callable[[float], None] = lambda _seconds: None
    """Told every answered turn's voice-to-voice (the gateway's admission watches it)."""


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
        owed: str | None = None,
        taken: tuple[str, ...] = (),
        unheard: Unheard | None = None,
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
        self.owed = owed
        """The last user turn is still to be answered: its utterance id ("" for typed text);
        saved with the history (store.StoredSession.owed). Given by a resume: its answer
        died with the gateway that was giving it, and `serve` gives it first."""
        self.taken = taken
        """The last utterances whose words joined the history (store.StoredSession.taken)."""
        self._unheard = unheard
        """Given by a resume: the last utterance its gateway sent for transcription, heard
        again by `serve` unless its words were taken."""
        self.inbox: asyncio.Queue[tuple[BusResult, bytes | None, float]] = asyncio.Queue(
            self.settings.inbox_size
        )
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
        context = ReplyContext(
            channel,
            self.bus,
            self.settings,
            tenant,
            self._spawn,
            self.clock,
            self._reply_record,
            self._reply_ended,
            services.voice_to_voice,
            channel.codec.confirms_playout,
        )
        self.replies = Replies(
            context, self.settings, services.agents, lambda: self.config, self.history
        )
        self._frames = ReadAhead()
        """The client's frames, read ahead of their handling (serve)."""
        self._ending = False
        """The connection is ending: the session's last save is its gateway's (app.py)."""
        self._saving = asyncio.Lock()
        """One save at a time, each of the state as it is when its turn comes: the record
        is written in the order of the changes (a slow write never lands after a newer)."""
        self._recorded = config.resumed is True
        """The session has a record (a save went, or it was resumed from one)."""
        self._owed_waits: str | None = None
        """The utterance heard again on resume: the owed answer waits on its words."""

    # ------------------------------------------------------------------ client inputs

    async def serve(self) -> None:
        """Handle client inputs until the client leaves or closes the session. A task of its
        own reads the socket ahead of the handling (ReadAhead): the client's close is read
        and answered at once, even while an input waits on Redis; the handling ends at the
        next frame it asks for (Disconnected)."""
        self._spawn(self._process_inbox(), "inbox")
        frames = self._frames
        self._spawn(frames.read(self.channel.io), "reader")
        try:
            if not await self._hear_again():
                await self._answer_owed()
            while True:
                for item in await self.channel.decode(await frames.get()):
                    try:
                        await self._on_input(item)
                    except SessionClosed:
                        await self.channel.close(1000, "session closed")
                        return
                    except VoiceAgentError as exc:
                        if exc.fatal:
                            raise
                        await self.channel.send_error(exc, answering=True)
        finally:
            await self._stop()

    async def take_over(self) -> None:
        """Another connection resumes this session (its client reconnected before this
        socket was found dead): this one is told and closed, and its handling ends as if
        its client had left (the session is then saved, for the new connection to load;
        on another gateway, that one owns the record and this save is refused)."""
        await self.channel.close(1000, "resumed on another connection")
        await self._frames.end()

    async def _on_input(self, item: ClientInput) -> None:
        match item:
            case AudioIn():
                await self.hearing.hear(item.pcm)  # a frame it refuses is not metered
                await self.meter.add_pcm16(len(item.pcm), self.config.input_sample_rate)
            case SessionUpdate():
                await self._update(item)
            case InputAudioCommit():
                await self.hearing.commit()
            case InputAudioClear():
                if self.hearing.clear():  # the user went on inside a hold, then took it back
                    await self.replies.release_held()
            case ConversationText():
                # what was heard of the answer goes first; the save of these words settles
                # what is owed (superseded: no save of the cut answer's own before it)
                await self.replies.cancel(superseded=True)
                await self._user_turn(item.text, owed="")
                await self.replies.start(None, None)
            case UserItem():
                await self._user_turn(item.text)  # answered by a response.create
            case ResponseCreate():
                await self.replies.start(None, None, fixed_text=item.text)
            case ResponseCancel():
                await self.replies.cancel()
            case SessionClose():
                raise SessionClosed
            case ConversationToolResult():
                await self._tool_result(item)
            case AudioPlayed():
                reply = self.replies.of(item.response_id)
                if reply is not None:
                    reply.played(item.played_bytes)

    async def _update(self, message: SessionUpdate) -> None:
        patch = message.session.model_dump(exclude_none=True)
        if "agent" in patch and patch["agent"] not in self.services.agents:
            known = ", ".join(sorted(self.services.agents))
            raise InvalidMessage(f"unknown agent {patch['agent']!r}; choose one of {known}")
        config = self.config.patched(patch)
        if "input_sample_rate" in patch:
            self.hearing.set_input_rate(patch["input_sample_rate"])
        self.config = config
        self.hearing.config = self.config
        if "turn_detection" in patch:
            self.hearing.set_turn_detection(self.config.turn_detection)
        await self.channel.send(SessionUpdated(session=self.config))
        await self._save()

    def busy(self) -> bool:
        """Whether closing the session now would cut a turn: the user is speaking, an
        utterance waits for its transcript, a turn is held for more speech, a reply is under
        way, or bus results wait to be handled."""
        return self.hearing.busy() or self.replies.busy() or not self.inbox.empty()

    def deliver(self, result: BusResult, audio: bytes | None) -> None:
        """A bus result for this session (called by the gateway's result reader)."""
        try:
            self.inbox.put_nowait((result, audio, self.clock()))
        except asyncio.QueueFull:
            log.error("session %s inbox full: result dropped", self.config.id)

    # ------------------------------------------------------------------ hearing's reports

    def speaking(self) -> bool:
        return self.replies.speaking()

    async def speech_started(self, utterance_id: str, start_ms: int) -> None:
        await self.channel.send(SpeechStarted(utterance_id=utterance_id, audio_start_ms=start_ms))
        self.replies.user_goes_on()

    async def speech_stopped(self, utterance_id: str, end_ms: int) -> None:
        await self.channel.send(SpeechStopped(utterance_id=utterance_id, audio_end_ms=end_ms))

    async def barged_in(self) -> None:
        await self.replies.cancel()

    async def partial(self, utterance_id: str, text: str) -> None:
        await self.channel.send(TranscriptPartial(utterance_id=utterance_id, text=text))

    async def pause_heard(self, utterance_id: str, heard: Heard) -> None:
        await self.replies.prepare(utterance_id, heard)

    async def speech_resumed(self, utterance_id: str) -> None:
        await self.replies.discard_prepared()  # the user went on: not the answer

    async def transcript(
        self, utterance: Utterance, text: str, language: str | None = None
    ) -> None:
        await self.channel.send(
            TranscriptFinal(
                utterance_id=utterance.id,
                text=text,
                audio_start_ms=utterance.start_ms,
                audio_end_ms=utterance.end_ms,
                language=language,
            )
        )
        if text.strip():
            self._owed_waits = None  # later words: they supersede the owed answer
            await self._user_said(text, utterance.id, utterance.speech_end_at, language)
        else:
            await self.replies.release_held()  # a sound, but nothing more was said
            await self._owed_after(utterance.id)

    async def asr_failed(self, error: VoiceAgentError) -> None:
        await self.channel.send_error(error)
        await self.replies.release_held()
        if self._owed_waits is not None and self._owed_waits not in self.hearing.pending:
            await self._owed_after(self._owed_waits)

    async def _owed_after(self, utterance_id: str) -> None:
        """The utterance heard again brought no words: the owed answer is given now."""
        if self._owed_waits == utterance_id:
            self._owed_waits = None
            await self._answer_owed()

    # ------------------------------------------------------------------ the turn

    async def _user_said(
        self,
        text: str,
        utterance_id: str,
        speech_end_at: float | None,
        language: str | None = None,
    ) -> None:
        """A transcript ends the user's turn, unless the end-of-turn policy holds on (its
        word rules only for a language they know: turn_end.word_rules_apply)."""
        joined = False
        if self.replies.continued():  # inside the hold: one turn, two breaths
            if joined := self._join_user_turn(text):
                metrics.TURN_HOLDS.labels("continued").inc()
        elif self.replies.cut_off():
            # what was heard of the answer is in the history now
            await self.replies.cancel(superseded=True)
            if joined := self._join_user_turn(text):
                metrics.CUT_OFFS_JOINED.inc()
        if joined:
            self._taking(utterance_id)
            await self._save()
        else:
            # an answer still playing (a turn too short to barge in) is cut here: what was
            # heard of it joins the history before these words, not after
            await self.replies.cancel(superseded=True)  # these words' save settles what is owed
            self._taking(utterance_id)
            await self._user_turn(text)
        self.hearing.words_taken(utterance_id)  # saved: not to be heard again
        policy = self.services.end_of_turn
        hold_ms = 0
        if word_rules_apply(language):
            hold_ms = await policy.hold_ms(list(self.history), self.history[-1].text)
        if hold_ms <= 0:
            await self.replies.start(utterance_id, speech_end_at)
        else:
            self.replies.hold(utterance_id, speech_end_at, hold_ms)

    # ------------------------------------------------------------------ history

    def _join_user_turn(self, text: str) -> bool:
        """`text` goes on from the last user turn: the agent's spoken turns after it (what
        was heard of an answer given too soon, over the user's words) leave the history,
        and the two parts are one turn. Not when an answer called tools: those turns stay,
        as they ran."""
        last_user = next(
            (i for i in range(len(self.history) - 1, -1, -1) if self.history[i].role == "user"),
            None,
        )
        if last_user is None:
            return False
        after = self.history[last_user + 1 :]
        if any(turn.role != "agent" or turn.tool_calls for turn in after):
            return False
        self.history[last_user:] = [Turn("user", f"{self.history[last_user].text} {text}")]
        return True

    def _taking(self, utterance_id: str) -> None:
        """The words of this utterance join the history now, to be answered."""
        self.owed = utterance_id
        self.taken = (*self.taken, utterance_id)[-TAKEN_KEPT:]

    async def _user_turn(self, text: str, owed: str | None = None) -> None:
        """The user's words join the history; `owed`: they are to be answered (the id of
        their utterance, "" for typed text), not only kept (a Realtime client's item)."""
        self.history.append(Turn("user", text))
        if owed is not None:
            self.owed = owed
        await self._save()

    async def _save(self) -> None:
        """Every change of the history ends here: its oldest turns past the cap go first.
        Once the session is ending, its gateway's last save writes it (app.py)."""
        keep_recent(self.history, self.settings.history_max_turns)
        if self._ending:
            return
        store = self.services.store
        if store is None:
            return
        async with self._saving:
            saved = await store.save(self.config, self.history, self.tenant, self.owed, self.taken)
            self._recorded = True
        if not saved:
            await self.take_over()  # its client resumed it on another gateway

    # ------------------------------------------------------------------ replies

    async def _reply_record(self, reply: Reply, status: Status, text: str) -> None:
        """A reply is ending (its client not yet told), however it ends: the agent's turn
        is what the user heard of it (with the tool calls it made and their results), saved
        first; while the session ends, its gateway's last save keeps it. The turn it
        answered is owed nothing more, unless the client is never told (the session
        ended before a word of it played) or another answer replaces it."""
        turns = [*reply_turns(text, reply.tool_turns), *reply.tool_results]
        if not turns:
            if reply.stopped or reply.superseded or self.owed is None:
                return  # nothing heard, the client not told (or answered anew): still owed
            self.owed = None  # failed or cancelled, as the client is about to be told
            await self._save()
            return
        self.owed = None
        self.history += turns  # in place: Replies reads the same list
        await self._save()

    async def _reply_ended(self, reply: Reply, status: Status, text: str) -> None:
        """A reply ended and its client was told (its record settled what is owed)."""
        self.replies.ended(reply)

    async def note_unheard(self, unheard: Unheard | None) -> None:
        """Note where the utterance just sent lies; a session without a record yet (its
        first words) gets one first, or a resume would not find it."""
        store = self.services.store
        if store is None or self._ending:
            return
        if not self._recorded:
            await self._save()
        if self._ending:  # its save found it resumed elsewhere: the note is theirs now
            return
        await store.note_unheard(self.config.id, unheard)

    async def _hear_again(self) -> bool:
        """A resumed session's last utterance sent for transcription whose words were never
        taken (its gateway died, or the link dropped, before they came): heard again, and
        answered as any turn (it supersedes an answer owed to an earlier turn: the user
        spoke after it). Whether it is being heard again."""
        unheard, self._unheard = self._unheard, None
        if unheard is None or unheard.utterance_id in self.taken:
            return False
        if not await self.hearing.hear_again(unheard):
            log.warning(
                "session %s: utterance %s, never transcribed, cannot be read back",
                self.config.id,
                unheard.utterance_id,
            )
            return False
        log.info("session %s: utterance %s heard again", self.config.id, unheard.utterance_id)
        metrics.HEARD_AGAIN.inc()
        self._owed_waits = unheard.utterance_id
        return True

    async def _answer_owed(self) -> None:
        """A resumed session whose last turn was never answered (its gateway died while
        answering, or the connection dropped before a word of the answer played) is
        answered first: the agent runs again on the same history. Not an agent that says
        it is not safe to run twice (`prepare_safe`: it may have run a side-effecting tool
        already): the client is told to say it again."""
        owed = self.owed
        if owed is None:
            return
        if not self.history or self.history[-1].role != "user":
            self.owed = None  # answered after all (its record came after the flag's save)
            return
        if not can_prepare(self.services.agents[self.config.agent]()):
            metrics.OWED_ANSWERS.labels("refused").inc()
            self.owed = None
            await self._save()
            await self.channel.send_error(
                AgentFailed(
                    f"the answer to {self.history[-1].text!r} was lost with the gateway "
                    f"giving it, and the agent {self.config.agent!r} is not run twice (it may "
                    "have side effects): say it again"
                )
            )
            return
        log.info("session %s: the answer owed to its last turn is given", self.config.id)
        metrics.OWED_ANSWERS.labels("answered").inc()
        await self.replies.start(owed or None, None)

    async def _tool_result(self, result: ConversationToolResult) -> None:
        """A client tool's output joins the history, after its call: a call of the reply
        still under way (its turns not yet in the history) takes it with its own turns. The
        client's `response.create` next lets the agent answer with it."""
        current = self.replies.current
        pending = current.tool_turns if current is not None and not current.recorded else []
        calls = {c.id for turn in [*self.history, *pending] for c in turn.tool_calls}
        if result.call_id not in calls:
            raise InvalidMessage(f"no function call {result.call_id!r} in this conversation")
        turn = Turn("tool", result.output, call_id=result.call_id)
        if current is not None and any(
            c.id == result.call_id for t in pending for c in t.tool_calls
        ):
            current.tool_results.append(turn)  # recorded with the reply, after its call
            return
        self.history.append(turn)
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
                reply = self.replies.of(result.response_id)
                if reply is None:
                    metrics.STALE_DROPPED.labels("tts_chunk").inc()
                else:
                    reply.on_chunk(result, audio)
            case TtsDone():
                reply = self.replies.of(result.response_id)
                if reply is not None:
                    reply.on_done(result)
            case JobFailed() if result.response_id is not None:
                reply = self.replies.of(result.response_id)
                if reply is not None:
                    await reply.on_failed(result)
            case JobFailed():
                await self.hearing.on_failed(result)

    # ------------------------------------------------------------------ tasks

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = self.tasks.create_task(coro, name=f"{self.config.id}-{name}")
        self._children.add(task)
        task.add_done_callback(self._children.discard)
        return task

    async def _stop(self) -> None:
        """The connection ends (the client left, closed, or resumes on another connection):
        the reply under way is kept as heard so far, for the last save that follows."""
        self._ending = True
        self.hearing.stop()
        await self.replies.stop()
        for task in list(self._children):
            task.cancel()
