"""The answer owed to the last turn: saved with the history until a reply to it ends, and
given first by the next connection when the gateway giving it died (kill -9 leaves no
goodbye save: only what each change saved).

The flag is what makes this safe: a resume answers a turn only when its record says the
answer never ended (not every history that ends with the user's words: a Realtime
client's items wait for its `response.create`, a failed reply was told as failed)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from services.common.bus.messages import TtsJob
from services.common.protocol.events import SessionConfig
from services.gateway.agent import AGENTS, AgentOutput, Turn
from services.gateway.store import SessionStore
from tests.component.session_harness import (
    FakeBus,
    RecordingStore,
    on_virtual_time,
    running_session,
    scripted,
    silence,
    tone,
    tts_as,
)

ORIGINAL = FakeBus._synthesize


@on_virtual_time
async def test_a_spoken_turn_is_owed_until_its_answer_is_recorded() -> None:
    store = RecordingStore()
    async with running_session(transcripts=["hello there"], store=cast(SessionStore, store)) as h:
        await h.say(silence(200), tone(900), silence(1000))
        done = await h.wait_for("response.done")
    utterance = h.of_type("transcript.final")[0]["utterance_id"]
    assert done["status"] == "completed"
    assert store.saves == [
        ([Turn("user", "hello there")], utterance),  # taken: its answer is owed
        ([Turn("user", "hello there"), Turn("agent", "hello there")], None),  # answered
    ]


@on_virtual_time
async def test_a_reply_that_failed_before_a_word_owes_nothing_more() -> None:
    async def synthesize(bus: FakeBus, job: TtsJob) -> None:
        await asyncio.sleep(0.05)
        bus.deliver(job.failed("tts_unavailable", "engine crashed"), None)

    store = RecordingStore()
    with tts_as(synthesize):
        async with running_session(store=cast(SessionStore, store)) as h:
            await h.send({"type": "conversation.text", "text": "hello"})
            done = await h.wait_for("response.done")
    assert done["status"] == "failed"  # told: asking again is the client's to do
    assert store.saves[0] == ([Turn("user", "hello")], "")  # typed text: owed, no utterance
    assert store.saves[-1] == ([Turn("user", "hello")], None)


@on_virtual_time
async def test_a_link_lost_before_a_word_of_the_answer_played_leaves_it_owed() -> None:
    async def slow(bus: FakeBus, job: TtsJob) -> None:
        await asyncio.sleep(30)  # the first piece never comes while the client is there

    store = RecordingStore()
    with tts_as(slow):
        async with running_session(store=cast(SessionStore, store)) as h:
            await h.send({"type": "conversation.text", "text": "hello"})
            await h.wait_for("response.created")
        # running_session's end: the client's link drops
    assert store.saves[-1] == ([Turn("user", "hello")], "")


@on_virtual_time
async def test_a_resumed_session_answers_the_turn_it_is_owed_first() -> None:
    store = RecordingStore()
    history = [Turn("user", "first"), Turn("agent", "first"), Turn("user", "remember the door")]
    async with running_session(
        history=history, owed="utt_lost", store=cast(SessionStore, store)
    ) as h:
        done = await h.wait_for("response.done")
    created = h.of_type("response.created")
    assert [c["utterance_id"] for c in created] == ["utt_lost"]  # the turn it answers
    assert (done["status"], done["text"]) == ("completed", "remember the door")
    assert h.audio_bytes() > 0
    assert store.saves[0] == ([*history, Turn("agent", "remember the door")], None)


@on_virtual_time
async def test_a_resume_owes_nothing_when_the_answer_was_recorded() -> None:
    history = [Turn("user", "hi"), Turn("agent", "hi")]
    async with running_session(history=history, owed="utt_old") as h:
        await asyncio.sleep(5)
    assert h.of_type("response.created") == []
    assert h.session.owed is None


async def _books() -> AsyncIterator[AgentOutput]:
    yield "Booked."


@on_virtual_time
async def test_an_agent_not_safe_to_run_twice_is_not_run_again_on_resume() -> None:
    store = RecordingStore()
    agents = {**AGENTS, "echo": scripted(_books, prepare_safe=False)}
    history = [Turn("user", "book a table for two")]
    async with running_session(
        agents=agents, history=history, owed="utt_lost", store=cast(SessionStore, store)
    ) as h:
        error = await h.wait_for("error")
        await asyncio.sleep(5)
    assert error["code"] == "agent_failed" and "say it again" in error["message"]
    assert h.of_type("response.created") == []  # it may have booked already: not again
    assert store.saves[0] == (history, None)  # told once, not on every later resume


async def _saved_when_told(synthesize: Any, cancel: bool) -> list[Any]:
    """What the store held each time a `response.done` was written, for one typed turn."""
    store = RecordingStore()
    saved_when_told: list[Any] = []
    with tts_as(synthesize):
        async with running_session(store=cast(SessionStore, store)) as h:
            send_text = h.socket.send_text

            async def spy(text: str) -> None:
                if '"response.done"' in text:  # what Redis holds as the client is told
                    saved_when_told.append(store.saves[-1])
                await send_text(text)

            h.socket.send_text = spy  # type: ignore[method-assign]
            await h.send({"type": "conversation.text", "text": "hello"})
            await h.wait_for("response.created")
            if cancel:
                await h.send({"type": "response.cancel"})
            done = await h.wait_for("response.done")
    assert done["status"] == ("cancelled" if cancel else "failed")
    return saved_when_told


@on_virtual_time
async def test_a_failed_or_cancelled_answer_is_owed_nothing_before_the_client_is_told() -> None:
    async def fails(bus: FakeBus, job: TtsJob) -> None:
        await asyncio.sleep(0.05)
        bus.deliver(job.failed("tts_unavailable", "engine crashed"), None)

    async def slow(bus: FakeBus, job: TtsJob) -> None:
        await asyncio.sleep(30)

    told_nothing_owed = [([Turn("user", "hello")], None)]  # a crash now: no repeat
    assert await _saved_when_told(fails, cancel=False) == told_nothing_owed
    assert await _saved_when_told(slow, cancel=True) == told_nothing_owed


@on_virtual_time
async def test_an_answer_asked_again_before_a_word_played_leaves_the_turn_owed() -> None:
    async def slow_first(bus: FakeBus, job: TtsJob) -> None:
        if len(bus.tts_jobs) == 1:
            await asyncio.sleep(30)  # the first answer's audio never comes
            return
        await ORIGINAL(bus, job)

    store = RecordingStore()
    with tts_as(slow_first):
        async with running_session(store=cast(SessionStore, store)) as h:
            await h.send({"type": "conversation.text", "text": "hello"})
            await h.wait_for("response.created")
            await h.send({"type": "response.create"})  # the agent again, same history
            await h.wait_for("response.created", 2)
            owed_while_answering = h.session.owed
            done = await h.wait_for("response.done", 2)
    assert owed_while_answering == ""  # the second answer still owes the turn
    assert done["status"] == "completed"
    assert store.saves[-1] == ([Turn("user", "hello"), Turn("agent", "hello")], None)


class _SlowSaves(RecordingStore):
    """Each save takes 50 ms (a Redis that waits for its replicas)."""

    async def save(
        self,
        config: SessionConfig,
        history: list[Turn],
        tenant: str,
        owed: str | None = None,
        taken: tuple[str, ...] = (),
    ) -> bool:
        await asyncio.sleep(0.05)
        return await super().save(config, history, tenant, owed)


@on_virtual_time
async def test_words_that_cut_an_answer_before_its_first_word_wait_for_one_save() -> None:
    """The user speaks on before a word of a slow answer played: the answer is cut, and
    the new words' save (their owed answer) is the one save before the next answer; the
    cut answer's own record is no second one on that path."""
    first = asyncio.Event()

    async def slow_first() -> AsyncIterator[AgentOutput]:
        if not first.is_set():
            first.set()
            await asyncio.sleep(3.0)
        yield "ok then"

    store = _SlowSaves()
    agents = {**AGENTS, "echo": scripted(slow_first)}
    async with running_session(
        transcripts=["one", "two"], store=cast(SessionStore, store), agents=agents
    ) as h:
        await h.say(silence(200), tone(900), silence(1000))
        await h.wait_for("response.created")
        await h.say(tone(900), silence(1000))
        await h.wait_for("response.done", 2)
    waited = h.time_of("response.created", 1) - h.time_of("transcript.final", 1)
    assert waited == pytest.approx(0.05, abs=0.005)
    assert store.saves[-2:] == [
        (
            [Turn("user", "one"), Turn("user", "two")],
            h.of_type("transcript.final")[1]["utterance_id"],
        ),
        ([Turn("user", "one"), Turn("user", "two"), Turn("agent", "ok then")], None),
    ]
