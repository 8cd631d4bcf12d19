"""One simulated user: speaks at real-time pace, waits for the agent, listens to the whole
reply as it plays (or talks over it), thinks a moment, and goes on until the level's
measured window is over.

Between utterances it streams silence, as a live microphone does. Everything the
server sends goes to a `Conversation`, which the level later turns into figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass, field

import websockets

from services.client.stream import SessionRefused, StreamClient
from services.loadtest.contract import Conversation, Response
from services.loadtest.corpus import RATE, Utterance
from services.loadtest.stats import TurnRecord, answer, turn_utterances

LEAD_SILENCE_MS = 300
"""Silence before each utterance (a microphone hears some); none when barging in."""
BARGE_IN_DELAY_S = (0.1, 0.4)
"""How long into the agent's audio a barging-in user starts talking."""
CLOSE_WAIT_S = 5.0


@dataclass(frozen=True)
class UserPlan:
    """How every user of a run behaves."""

    url: str
    corpus: tuple[Utterance, ...]
    frame_ms: int = 20
    barge_in_rate: float = 0.0
    think_s: tuple[float, float] = (0.2, 2.0)
    """After the reply has played out: the user's gap before speaking again (uniform)."""
    reply_timeout_s: float = 20.0
    drain_timeout_s: float = 20.0
    seed: int = 0
    api_key: str | None = field(default=None, repr=False)
    """An API key or client token for every session (`Authorization: Bearer`)."""


@dataclass(frozen=True)
class Window:
    """One level's timeline: a ramp, then the measured window (on the clock `start` is on:
    time.time() between processes, time.monotonic() for the users themselves)."""

    start: float
    ramp_s: float
    duration_s: float
    sessions: int
    min_turns: int = 0
    """Each session goes on starting turns past `until` while fewer than this many started
    in the window (a one-session level collecting enough turns for a p95)..."""
    max_extra_s: float = 0.0
    """... for at most this long past `until`."""

    def start_of(self, index: int) -> float:
        return self.start + self.ramp_s * index / max(1, self.sessions)

    @property
    def measured_from(self) -> float:
        return self.start + self.ramp_s

    @property
    def until(self) -> float:
        return self.measured_from + self.duration_s

    def open_for(self, now: float, started: int) -> bool:
        """Whether a session that started `started` turns in the window may start another
        at `now`: before `until`, or past it while short of `min_turns` (within
        `max_extra_s`)."""
        if now < self.until:
            return True
        return started < self.min_turns and now < self.until + self.max_extra_s


@dataclass
class Live:
    """What this process's sessions have done so far, for the progress line."""

    up: int = 0
    turns: int = 0  # started in the measured window: what the results count as turns
    ramp_turns: int = 0  # started during the ramp (warm-up, not in the results)
    failures: int = 0  # failed connections and timeouts
    v2v_ms: list[float] = field(default_factory=list)
    conversations: list[Conversation] = field(default_factory=list)

    @property
    def errors(self) -> int:
        return self.failures + sum(len(c.errors) for c in self.conversations)


@dataclass
class SessionRun:
    """One session's record."""

    conversation: Conversation
    turns: list[TurnRecord] = field(default_factory=list)
    send_lag_ms: list[float] = field(default_factory=list)
    connect_error: str | None = None
    timeouts: int = 0
    spoke_s: float = 0.0  # speech sent (the clips' length)
    alive_s: float = 0.0  # connected
    window_extra_s: float = 0.0  # how far past `Window.until` it went on starting turns


class User:
    """One session of the load: `await User(...).run()`."""

    def __init__(self, plan: UserPlan, window: Window, index: int, live: Live) -> None:
        self.plan = plan
        self.window = window
        self.index = index
        self.live = live
        self.rng = random.Random(plan.seed * 1_000_003 + index)  # noqa: S311 (a simulation)
        self.record = SessionRun(Conversation())
        self._next = self.rng.randrange(len(plan.corpus))

    async def run(self) -> SessionRun:
        await asyncio.sleep(max(0.0, self.window.start_of(self.index) - time.monotonic()))
        conversation = self.record.conversation
        client = StreamClient(
            self.plan.url, on_message=conversation.feed, api_key=self.plan.api_key
        )
        try:
            await client.__aenter__()
        except SessionRefused as exc:  # an `error` or a close instead of session.created
            return self._failed(_refusal_code(exc))
        except websockets.InvalidStatus as exc:  # e.g. 429: the tenant's limits
            return self._failed(f"refused_{exc.response.status_code}")
        except Exception:
            return self._failed("connect_failed")
        conversation.start(client.session)
        self.live.conversations.append(conversation)
        self.live.up += 1
        connected = time.monotonic()
        try:
            await self._session(client)
        finally:
            self.live.up -= 1
            self.record.alive_s = time.monotonic() - connected
            self.record.send_lag_ms = client.send_lag_ms
            await client.__aexit__()
        return self.record

    def _failed(self, code: str) -> SessionRun:
        self.record.connect_error = code
        self.live.failures += 1
        return self.record

    async def _session(self, client: StreamClient) -> None:
        conversation = self.record.conversation
        asked = False
        try:
            await self._converse(client)
            settled = conversation.settled
            await client.silence_while(lambda: not settled(), self.plan.drain_timeout_s)
            await client.send({"type": "session.close"})
            asked = True
            async with asyncio.timeout(CLOSE_WAIT_S):
                await client.closed.wait()
        except (websockets.ConnectionClosed, TimeoutError):
            pass
        if not asked:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await client.closed.wait()  # the reader records how it ended
        conversation.connection_closed(client.close_code, asked)
        conversation.finish()
        self.live.failures += self.record.timeouts

    def _open(self, now: float) -> bool:
        started = sum(turn.in_window for turn in self.record.turns)
        return self.window.open_for(now, started)

    async def _converse(self, client: StreamClient) -> None:
        plan, barge = self.plan, False
        while self._open(time.monotonic()) and not client.closed.is_set():
            now = time.monotonic()
            utterance = self._utterance()
            turn = TurnRecord(utterance.script, now, barge, self.window.measured_from <= now)
            self.record.turns.append(turn)
            client.new_turn()  # the client's own per-turn buffer: keep it small
            lead = 0 if barge else LEAD_SILENCE_MS
            spoken = await client.speak(utterance.audio, RATE, plan.frame_ms, lead)
            self.record.spoke_s += utterance.audio.size / RATE
            turn.last_sent_at = spoken.last_speech_sent_at
            response = await self._answer(client, turn)
            barge = response is not None and self.rng.random() < plan.barge_in_rate
            if response is not None and barge:
                barge = await self._wait_to_barge_in(client, response)
            if response is not None and not barge:
                await self._until_done(client, response)
            self._count(response, turn)
            if not barge:
                await client.silence(self.rng.uniform(*plan.think_s), plan.frame_ms)
        until = self.window.until
        if any(turn.started_at >= until for turn in self.record.turns):  # it went on
            self.record.window_extra_s = time.monotonic() - until

    async def _until_done(self, client: StreamClient, response: Response) -> None:
        """Listen to the whole reply: until its `response.done`, then until its audio has
        played (the gateway sends it a little ahead of real time)."""
        timeout_s, frame_ms = self.plan.reply_timeout_s, self.plan.frame_ms
        ended = await client.silence_while(lambda: response.done_at is None, timeout_s, frame_ms)
        self.record.timeouts += not ended
        playing_s = (response.played_until or 0.0) - time.monotonic()
        if ended and playing_s > 0:
            await client.silence(playing_s, frame_ms)

    def _utterance(self) -> Utterance:
        corpus = self.plan.corpus
        utterance = corpus[self._next % len(corpus)]
        self._next += 1
        return utterance

    async def _answer(self, client: StreamClient, turn: TurnRecord) -> Response | None:
        """Stream silence until the turn is answered (or ends without an answer)."""
        conversation = self.record.conversation
        found: list[Response | None] = []

        def waiting() -> bool:
            mine = turn_utterances(conversation, turn.started_at)
            response = answer(conversation, mine)
            end = mine[-1] if mine else None
            unanswerable = end is not None and end.final_at is not None and not end.text.strip()
            failed = any(at >= (turn.last_sent_at or 0.0) for at, _ in conversation.errors)
            if response is not None or unanswerable or failed:
                found.append(response)
                return False
            return True

        resolved = await client.silence_while(
            waiting, self.plan.reply_timeout_s, self.plan.frame_ms
        )
        self.record.timeouts += not resolved
        return found[-1] if found else None

    async def _wait_to_barge_in(self, client: StreamClient, response: Response) -> bool:
        """Wait for the agent's audio, let it play a moment; True if it is still playing."""
        frame_ms = self.plan.frame_ms
        await client.silence_while(
            lambda: response.first_audio_at is None and response.playing,
            self.plan.reply_timeout_s,
            frame_ms,
        )
        if response.first_audio_at is None or not response.playing:
            return False
        await client.silence(self.rng.uniform(*BARGE_IN_DELAY_S), frame_ms)
        return response.playing and self._open(time.monotonic())

    def _count(self, response: Response | None, turn: TurnRecord) -> None:
        if turn.in_window:
            self.live.turns += 1
        else:
            self.live.ramp_turns += 1
        if response is not None and response.first_audio_at is not None and turn.last_sent_at:
            self.live.v2v_ms.append((response.first_audio_at - turn.last_sent_at) * 1000)


def _refusal_code(refused: SessionRefused) -> str:
    """How `errors` counts a session refused before `session.created`: `closed_<code>` for
    its close code (1013: at capacity), else the `error` event's code, else
    `connect_failed`."""
    if refused.close_code is not None:
        return f"closed_{refused.close_code}"
    return str(refused.code) if refused.code else "connect_failed"
