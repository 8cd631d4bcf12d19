"""Spoken load for the fault drill: sessions that speak turn after turn at real-time pace,
and, when the server closes or drops them, reconnect and resume (`?session_id=`).

Engine-agnostic (lite or fake engines): a turn *completes* when its answer comes
(`response.done` completed, with audio); it is *lost* when the user finished speaking and
no completed answer came (a close, a timeout, a failed response); it is *cut* when the
connection ended while the user was still speaking (the drill's faults may do that; the
issue's bar is that no turn that had finished speaking is lost). A turn whose connection
ended before its answer is answered *on resume* when the session's next connection gives
that answer first (the gateway owed it: docs/protocol.md). *Duplicated*: a second
`transcript.final` for one utterance, a second `response.done` for one response, or a
second completed answer to one utterance, whichever connection they came on.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import websockets

from services.client.stream import StreamClient
from services.common.audio.pcm import AudioF32

TURN_TIMEOUT_S = 30.0
RECONNECT_S = 0.5
OWED_ANSWER_S = 2.0
"""How long a resumed connection waits for the answer its last turn is owed: it begins
as soon as the session is (its `response.created` follows `session.created`)."""


@dataclass
class Turn:
    session: int
    n: int
    started: float
    spoken_at: float | None = None
    """When the speech was all sent (None: the connection ended first)."""
    done_at: float | None = None
    status: str | None = None
    """`response.done`'s status; `timeout`, `closed` or `cut` otherwise."""
    audio_bytes: int = 0
    errors: list[str] = field(default_factory=list)
    ended_at: float | None = None
    heard: bool = False
    """Its `transcript.final` came (the gateway had its words: a resume owes their answer)."""
    answered_on_resume: bool = False
    """Its connection ended before the answer; the next connection gave it."""

    @property
    def completed(self) -> bool:
        return self.status == "completed" and self.audio_bytes > 0

    @property
    def lost(self) -> bool:
        return self.spoken_at is not None and self.status is not None and not self.completed


@dataclass
class SpokenLoad:
    url: str
    sessions: int
    corpus: list[AudioF32]
    api_key: str | None = None
    pause_s: float = 0.5
    turns: list[Turn] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    closes: Counter[int] = field(default_factory=Counter)
    """Connections the server closed or dropped, by close code (1006: dropped)."""
    connect_failures: int = 0
    resumes: Counter[str] = field(default_factory=Counter)
    """Reconnections by outcome: `resumed`, `new` (the session was not found)."""
    session_ids: dict[int, str] = field(default_factory=dict)
    _finals: Counter[str] = field(default_factory=Counter)
    _dones: Counter[str] = field(default_factory=Counter)
    _answers: Counter[str] = field(default_factory=Counter)
    """Completed answers per utterance."""
    _answering: dict[str, str] = field(default_factory=dict)
    """The utterance each response answers (its `response.created` says)."""

    async def run(self) -> None:
        await asyncio.gather(*(self._session(i) for i in range(self.sessions)))

    def completed_after(self, at: float) -> dict[int, float]:
        """Each session's first completed turn that started after `at`: when it ended."""
        first: dict[int, float] = {}
        for t in self.turns:
            if t.started > at and t.completed and t.done_at is not None:
                first[t.session] = min(first.get(t.session, t.done_at), t.done_at)
        return first

    async def until_each_completed_after(self, at: float, timeout_s: float) -> bool:
        """Wait until every session completed a turn started after `at`; False: timed out."""
        deadline = time.monotonic() + timeout_s
        while len(self.completed_after(at)) < self.sessions:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.1)
        return True

    def duplicated(self) -> int:
        counted = (self._finals, self._dones, self._answers)
        return sum(1 for counts in counted for n in counts.values() if n > 1)

    def _seen(self, index: int) -> Any:
        def on_message(_: float, message: dict[str, Any] | bytes) -> None:
            if isinstance(message, bytes):
                return
            kind = message.get("type")
            if kind == "transcript.final":
                self._finals[f"{index}:{message.get('utterance_id')}"] += 1
            elif kind == "response.done":
                response = f"{index}:{message.get('response_id')}"
                self._dones[response] += 1
                if message.get("status") == "completed" and response in self._answering:
                    self._answers[self._answering[response]] += 1
            elif kind == "response.created" and message.get("utterance_id"):
                response = f"{index}:{message.get('response_id')}"
                self._answering[response] = f"{index}:{message.get('utterance_id')}"

        return on_message

    async def _session(self, index: int) -> None:
        n = 0
        while not self.stop.is_set():
            session_id = self.session_ids.get(index)
            url = self.url if session_id is None else f"{self.url}?session_id={session_id}"
            try:
                client = StreamClient(
                    url, on_message=self._seen(index), open_timeout_s=10, api_key=self.api_key
                )
                async with client:
                    if session_id is not None:
                        resumed = client.session.get("resumed") is True
                        self.resumes["resumed" if resumed else "new"] += 1
                        if resumed:
                            await self._owed_answer(client, index)
                    self.session_ids[index] = client.session["id"]
                    while not self.stop.is_set() and not client.closed.is_set():
                        n += 1
                        await self._turn(client, index, n)
                    if client.closed.is_set() and client.close_code is not None:
                        self.closes[client.close_code] += 1
            except (OSError, TimeoutError, websockets.InvalidHandshake, RuntimeError):
                self.connect_failures += 1
            except websockets.ConnectionClosed as closed:
                self.closes[closed.rcvd.code if closed.rcvd else 1006] += 1
            if not self.stop.is_set():
                await asyncio.sleep(RECONNECT_S)

    async def _owed_answer(self, client: StreamClient, index: int) -> None:
        """A resumed session whose last turn's connection ended before its answer: the
        answer comes first on this one, or not at all."""
        turn = next((t for t in reversed(self.turns) if t.session == index), None)
        if turn is None or turn.status != "closed":
            return
        received = client.received  # since session.created: the answer may be there
        with contextlib.suppress(TimeoutError):
            await client.silence_until("response.created", OWED_ANSWER_S)
            done = await client.silence_until("response.done", TURN_TIMEOUT_S)
            turn.status = str(done.get("status"))
            turn.audio_bytes = len(received.audio)
            turn.done_at = turn.ended_at = time.monotonic()
            turn.answered_on_resume = True

    async def _turn(self, client: StreamClient, index: int, n: int) -> None:
        turn = Turn(index, n, time.monotonic())
        self.turns.append(turn)
        received = client.new_turn()
        try:
            await client.speak(self.corpus[(index + n) % len(self.corpus)], 16000)
            turn.spoken_at = time.monotonic()
            done = await client.silence_until("response.done", TURN_TIMEOUT_S)
            turn.status = str(done.get("status"))
            turn.done_at = time.monotonic()
        except TimeoutError:
            turn.status = "closed" if client.closed.is_set() else "timeout"
        except websockets.ConnectionClosed:
            turn.status = "closed" if turn.spoken_at is not None else "cut"
        turn.audio_bytes = len(received.audio)
        turn.errors = [str(e.get("code")) for e in received.of_type("error")]
        turn.heard = bool(received.of_type("transcript.final"))
        if turn.status == "completed" and turn.audio_bytes == 0:
            turn.status = "no audio"
        turn.ended_at = time.monotonic()
        with contextlib.suppress(websockets.ConnectionClosed):
            await client.silence(self.pause_s)  # a late repeat would show here
        if turn.status in ("closed", "cut"):  # the reader sees the close a moment later
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(client.closed.wait(), 5)


def score(load: SpokenLoad, fault_at: float | None) -> dict[str, Any]:
    """Turns completed, lost, cut and duplicated, closes by code, and the recovery: from
    the fault until every session had completed a turn begun after it. Turns that ended
    before the fault (the warm-up) are counted apart: the fault did nothing to them."""
    finished = [t for t in load.turns if t.status is not None]
    before = [t for t in finished if fault_at is not None and (t.ended_at or 0) < fault_at]
    counted = [t for t in finished if t not in before]
    after = load.completed_after(fault_at) if fault_at is not None else {}
    recovered = (
        round(max(after.values()) - fault_at, 2)
        if fault_at is not None and len(after) == load.sessions
        else None
    )
    first = round(min(after.values()) - fault_at, 2) if fault_at is not None and after else None
    return {
        "sessions": load.sessions,
        "turns_completed": sum(t.completed for t in counted),
        "turns_lost": sum(t.lost for t in counted),
        "turns_cut_mid_speech": sum(t.status == "cut" for t in counted),
        "turns_duplicated": load.duplicated(),
        "turns_answered_on_resume": sum(t.answered_on_resume and t.completed for t in counted),
        "lost_detail": [
            {
                "session": t.session,
                "turn": t.n,
                "status": t.status,
                "errors": t.errors,
                "transcript_came": t.heard,
            }
            for t in counted
            if t.lost
        ][:10],
        "warmup_turns": {
            "completed": sum(t.completed for t in before),
            "lost": sum(t.lost for t in before),
        },
        "closes_by_code": {str(code): n for code, n in sorted(load.closes.items())},
        "reconnects": dict(load.resumes),
        "connect_failures": load.connect_failures,
        "first_turn_after_fault_s": first,
        "recovery_s": recovered,
    }


async def stop_load(load: SpokenLoad, runner: asyncio.Task[None]) -> None:
    """Stop the users after their turn in progress (or give up on it)."""
    load.stop.set()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(runner), TURN_TIMEOUT_S + 15)
    if not runner.done():
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
