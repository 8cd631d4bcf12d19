"""A session's answers: the reply playing, the one prepared during a pause, the held turn.

`Replies` decides which `Reply` (services/gateway/reply.py) answers a turn: the one
prepared on the pause's speculative transcript when the turn ended there with the same
words on the same history, else a new one. It also keeps the turn the end-of-turn policy
holds (the user may go on) until its hold runs out, and routes TTS results to the reply
they belong to. The history it answers is the session's own list (read, never changed).

Replies follow one another: a reply begins once the one before has ended and its client
was told (its `response.done` comes before the next `response.created`, and its turns are
in the history the next one answers), however it ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from services.common.protocol.events import SessionConfig
from services.gateway import metrics
from services.gateway.agent import Agent, AgentOutput, ClientTools, Turn, agent_stream, can_prepare
from services.gateway.reply import Reply, ReplyContext, TextSource
from services.gateway.settings import GatewaySection
from services.gateway.turn_end import Heard


@dataclass
class _Prepared:
    """A reply started on a pause's speculative transcript, held back until the turn ends."""

    reply: Reply
    utterance_id: str
    text: str
    """The user's words it answers."""
    before: Turn | None
    """The history's last turn before them (None: it was empty). The object itself: the
    history keeps its newest turns only, so its length says nothing."""


@dataclass
class _Held:
    """A user turn the end-of-turn policy is holding on: the user may go on."""

    utterance_id: str
    speech_end_at: float | None
    timer: asyncio.TimerHandle | None  # None once the user spoke again


class Replies:
    """The reply playing (at most one), the reply prepared (at most one), the held turn."""

    def __init__(
        self,
        context: ReplyContext,
        settings: GatewaySection,
        agents: dict[str, Callable[[], Agent]],
        config: Callable[[], SessionConfig],
        history: list[Turn],
    ) -> None:
        self.context = context
        self.settings = settings
        self.agents = agents
        self.config = config
        self.history = history
        self.current: Reply | None = None
        self._last: Reply | None = None
        """The reply that played last (it may still be ending: cancelled by another task,
        or finishing on its own)."""
        self._prepared: _Prepared | None = None
        self._held: _Held | None = None
        self._went_on_from: Reply | None = None
        """The reply playing when the user spoke again within `cut_off_join_ms` of the end
        of the speech it answers."""
        self._starting = asyncio.Lock()
        """One answer begins at a time: a transcript (the inbox task) and a client's
        `response.create` (the input loop) may both begin one, and each waits for Redis
        while it cancels the reply before; the second must see the first's reply."""

    def speaking(self) -> bool:
        return self.current is not None and self.current.speaking

    def busy(self) -> bool:
        """A reply is under way, or a turn is held for more speech."""
        return self.current is not None or self._held is not None

    def of(self, response_id: str) -> Reply | None:
        """The reply playing, or the one prepared, that a TTS result belongs to."""
        prepared = self._prepared.reply if self._prepared is not None else None
        for reply in (self.current, prepared):
            if reply is not None and reply.id == response_id:
                return reply
        return None

    def ended(self, reply: Reply) -> None:
        """A reply finished or was cancelled (its own report)."""
        if self.current is reply:
            self.current = None

    # ------------------------------------------------------------------ prepared

    async def prepare(self, utterance_id: str, heard: Heard) -> None:
        """The speculative transcript of a pause: prepare the reply to it, held back."""
        async with self._starting:
            await self._prepare(utterance_id, heard)

    async def _prepare(self, utterance_id: str, heard: Heard) -> None:
        await self.discard_prepared()
        if not self.settings.prepare_replies or not heard.text.strip():
            return
        if self.current is not None or self._held is not None:
            return  # the agent is speaking, or an earlier turn is held: not a fresh turn
        config = self.config()
        agent = self.agents[config.agent]()
        if not can_prepare(agent):  # one with side effects is never started early
            return
        history = [*self.history, Turn("user", heard.text)]
        source = respond(agent, history, config)
        reply = Reply(self.context, config, source, config.agent, utterance_id)
        before = self.history[-1] if self.history else None
        self._prepared = _Prepared(reply, utterance_id, heard.text, before)
        await reply.start(held=True)

    async def discard_prepared(self) -> None:
        prepared, self._prepared = self._prepared, None
        await _discard(prepared)

    def _answers(self, prepared: _Prepared, utterance_id: str | None) -> bool:
        """Whether a prepared reply answers the turn that just ended: the same utterance,
        the same words, on the same history (nothing else was said since), with the
        session's settings as they are now (no `session.update` since)."""
        if prepared.utterance_id != utterance_id or not self.history:
            return False
        if prepared.reply.config != self.config():
            return False
        before = self.history[-2] if len(self.history) > 1 else None
        return self.history[-1] == Turn("user", prepared.text) and before is prepared.before

    # ------------------------------------------------------------------ playing

    async def start(
        self, utterance_id: str | None, speech_end_at: float | None, fixed_text: str | None = None
    ) -> None:
        """Answer now: the prepared reply when it answers this turn, else a new one (the
        agent on the history as it is now, or `fixed_text`)."""
        async with self._starting:
            await self._start(utterance_id, speech_end_at, fixed_text)

    async def _start(
        self, utterance_id: str | None, speech_end_at: float | None, fixed_text: str | None
    ) -> None:
        await self.cancel(superseded=fixed_text is None)
        self.drop_held()  # a reply now supersedes the held turn
        prepared, self._prepared = self._prepared, None
        if fixed_text is None and prepared is not None and self._answers(prepared, utterance_id):
            metrics.PREPARED_REPLIES.labels("used").inc()
            metrics.PREPARED_TTS_SECONDS.labels("used").inc(prepared.reply.audio_seconds)
            self.current = self._last = prepared.reply
            await prepared.reply.release(utterance_id, speech_end_at)
            return
        await _discard(prepared)
        config = self.config()
        if fixed_text is not None:
            source, agent = fixed(fixed_text), None
        else:
            chosen = self.agents[config.agent]()
            source = respond(chosen, list(self.history), config)
            agent = config.agent
        reply = Reply(self.context, config, source, agent, utterance_id, speech_end_at)
        self.current = self._last = reply
        await reply.start()

    async def cancel(self, superseded: bool = False) -> None:
        """Stop the reply playing (the user keeps what they heard); returns once the last
        reply has ended and its client was told, also when it was ending already.
        `superseded`: for another answer of the agent to the same history, or for the
        user's next words (`Reply.superseded`)."""
        self.current = None
        if self._last is not None:  # the reply playing is the last one
            if not self._last.done:
                self._last.superseded = superseded
            await self._last.cancel()

    def cut_off(self) -> bool:
        """Whether the words now heard go on from a turn answered too soon: the user spoke
        again within `cut_off_join_ms` of its end, and its answer has not played to its
        end (interrupted, or still playing and about to be replaced). Asked once per
        transcript."""
        reply, self._went_on_from = self._went_on_from, None
        return reply is not None and (reply.cancelled or reply is self.current)

    async def stop(self) -> None:
        """The session ends: every reply's work stops."""
        self.drop_held()
        for reply in (self.current, self._prepared.reply if self._prepared else None):
            if reply is not None:
                await reply.stop()

    # ------------------------------------------------------------------ the held turn

    def hold(self, utterance_id: str, speech_end_at: float | None, hold_ms: int) -> None:
        """Wait `hold_ms` for more speech before answering this turn."""
        timer = asyncio.get_running_loop().call_later(hold_ms / 1000, self._hold_expired)
        self._held = _Held(utterance_id, speech_end_at, timer)

    def user_goes_on(self) -> None:
        """The user speaks again: the held turn waits for the rest, however long; a reply
        to speech that ended within `cut_off_join_ms` may have cut them off (`cut_off`)."""
        if self._held is not None and self._held.timer is not None:
            self._held.timer.cancel()
            self._held.timer = None
        reply, window = self.current, self.settings.cut_off_join_ms / 1000
        soon = (
            reply is not None
            and not reply.done
            and reply.speech_end_at is not None
            and self.context.clock() - reply.speech_end_at <= window
        )
        self._went_on_from = reply if soon else None

    def continued(self) -> bool:
        """Forget the held turn; whether the user went on inside its hold (the next words
        belong to the same turn: one turn, two breaths)."""
        held = self.drop_held()
        return held is not None and held.timer is None

    def drop_held(self) -> _Held | None:
        """Forget the held turn, its timer stopped; returns it."""
        held, self._held = self._held, None
        if held is not None and held.timer is not None:
            held.timer.cancel()
        return held

    def _hold_expired(self) -> None:
        metrics.TURN_HOLDS.labels("expired").inc()
        self.context.spawn(self.release_held(), "hold-expired")

    async def release_held(self) -> None:
        """Answer the held turn now (its hold ran out, or what followed had no words)."""
        held = self.drop_held()
        if held is not None:
            await self.start(held.utterance_id, held.speech_end_at)


async def _discard(prepared: _Prepared | None) -> None:
    if prepared is not None:
        metrics.PREPARED_REPLIES.labels("discarded").inc()
        await prepared.reply.discard()
        metrics.PREPARED_TTS_SECONDS.labels("discarded").inc(prepared.reply.audio_seconds)


def respond(agent: Agent, history: list[Turn], config: SessionConfig) -> TextSource:
    """The agent's reply to `history` as a text source (a snapshot of the history), with the
    session's instructions and the tools its client runs."""
    tools = ClientTools(tuple(config.tools or ()), config.tool_choice or "auto")
    return lambda: agent_stream(agent, history, config.instructions, tools)


def fixed(text: str) -> TextSource:
    async def say() -> AsyncIterator[AgentOutput]:
        yield text

    return say
