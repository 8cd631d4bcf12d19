"""The reply prepared during a pause: started on the speculative transcript, held back,
played at once when the turn ends there, discarded unseen when the user goes on."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from services.gateway import metrics
from services.gateway.agent import AGENTS, Agent, Turn
from services.gateway.settings import GatewaySection
from tests.component.session_harness import on_virtual_time, running_session, silence, tone


def count(name: str, outcome: str) -> float:
    counter = {"replies": metrics.PREPARED_REPLIES, "tts": metrics.PREPARED_TTS_SECONDS}[name]
    return float(counter.labels(outcome)._value.get())


class Recording:
    """An agent that says what it was asked about, and records each history it got."""

    name = "recording"
    prepare_safe = True

    def __init__(self, calls: list[list[Turn]], reply: str | None = None) -> None:
        self.calls = calls
        self.reply = reply
        """What it says (None: "you said" and the last turn's words)."""

    async def respond(
        self, history: list[Turn], instructions: str | None = None
    ) -> AsyncIterator[str]:
        self.calls.append(list(history))
        yield self.reply or f"you said {history[-1].text}"


def agents(calls: list[list[Turn]], safe: bool = True) -> dict[str, type[Agent] | object]:
    def make() -> Recording:
        agent = Recording(calls)
        agent.prepare_safe = safe
        return agent

    return {**AGENTS, "echo": make}


@on_virtual_time
async def test_a_turn_that_ends_at_its_pause_plays_the_prepared_reply_at_once() -> None:
    used, tts_used = count("replies", "used"), count("tts", "used")
    calls: list[list[Turn]] = []
    async with running_session(transcripts=["book a table"], agents=agents(calls)) as h:
        await h.say(silence(200), tone(900), silence(1000))
        done = await h.wait_for("response.done")
    # one agent call, during the pause, on the speculative words; nothing of it was sent
    # before the turn ended, then it all went at once
    assert calls == [[Turn("user", "book a table")]]
    (tts_sent, _), *_ = h.bus.tts_jobs
    stopped = h.time_of("speech.stopped")
    assert tts_sent < stopped - 0.2  # synthesis began well before the end of the turn
    assert h.time_of("response.created") >= stopped
    assert h.socket.audio[0][0] == pytest.approx(stopped, abs=0.01)
    assert done["status"] == "completed" and done["text"] == "you said book a table"
    assert (
        h.of_type("response.created")[0]["utterance_id"]
        == h.of_type("speech.stopped")[0]["utterance_id"]
    )
    assert count("replies", "used") - used == 1
    assert count("tts", "used") - tts_used > 0
    assert [(t.role, t.text) for t in h.session.history] == [
        ("user", "book a table"),
        ("agent", "you said book a table"),
    ]


@on_virtual_time
async def test_a_user_who_goes_on_never_sees_hears_or_remembers_the_prepared_reply() -> None:
    discarded = count("replies", "discarded")
    calls: list[list[Turn]] = []
    async with running_session(transcripts=["book a table"], agents=agents(calls)) as h:
        # a pause long enough to be transcribed and prepared, then more speech
        await h.say(silence(200), tone(900), silence(450), tone(700), silence(1000))
        done = await h.wait_for("response.done")
    assert count("replies", "discarded") - discarded == 1
    prepared_id = h.bus.tts_jobs[0][1].response_id
    assert any(r == prepared_id for _, r in h.bus.cancelled)  # its TTS work stopped
    sent = [e for _, e in h.socket.events if e.get("response_id") == prepared_id]
    assert sent == []  # no event of it reached the client
    assert [e["response_id"] for e in h.of_type("response.created")] == [done["response_id"]]
    assert done["response_id"] != prepared_id and done["status"] == "completed"
    # the final answer was asked on the history without the prepared reply in it
    assert calls[-1] == [Turn("user", "book a table")]
    assert [(t.role, t.text) for t in h.session.history] == [
        ("user", "book a table"),
        ("agent", "you said book a table"),
    ]


@on_virtual_time
async def test_an_agent_not_safe_to_run_early_is_never_prepared() -> None:
    calls: list[list[Turn]] = []
    async with running_session(transcripts=["pay the bill"], agents=agents(calls, False)) as h:
        await h.say(silence(200), tone(900), silence(1000))
        await h.wait_for("response.done")
    assert len(calls) == 1  # asked once, after the turn ended
    (tts_sent, _), *_ = h.bus.tts_jobs
    assert tts_sent >= h.time_of("speech.stopped")


@on_virtual_time
async def test_preparing_can_be_turned_off() -> None:
    settings = GatewaySection(prepare_replies=False)
    async with running_session(settings=settings, transcripts=["hello"]) as h:
        await h.say(silence(200), tone(900), silence(1000))
        await h.wait_for("response.done")
    (tts_sent, _), *_ = h.bus.tts_jobs
    assert tts_sent >= h.time_of("transcript.final")
    first = h.socket.audio[0][0]
    assert first == pytest.approx(h.time_of("transcript.final") + h.bus.tts_first_s, abs=0.01)


@on_virtual_time
async def test_a_client_text_turn_discards_what_was_prepared() -> None:
    discarded = count("replies", "discarded")
    calls: list[list[Turn]] = []
    async with running_session(transcripts=["book a table"], agents=agents(calls)) as h:
        await h.say(silence(200), tone(900), silence(450))
        await h.send({"type": "conversation.text", "text": "never mind"})
        done = await h.wait_for("response.done")
    assert done["text"] == "you said never mind"
    assert count("replies", "discarded") - discarded == 1


@on_virtual_time
async def test_a_session_keeps_its_newest_turns_and_still_plays_what_it_prepared() -> None:
    """At the cap of `history_max_turns` the history's length stops telling whether anything
    was said since a reply was prepared: the prepared reply is still played, and the
    history keeps its newest turns only."""
    used = count("replies", "used")
    calls: list[list[Turn]] = []
    earlier = [Turn("user" if i % 2 == 0 else "agent", f"turn {i}") for i in range(4)]
    settings = GatewaySection(history_max_turns=4)
    async with running_session(
        settings=settings, transcripts=["book a table"], agents=agents(calls), history=earlier
    ) as h:
        await h.say(silence(200), tone(900), silence(1000))
        done = await h.wait_for("response.done")
    assert done["status"] == "completed" and done["text"] == "you said book a table"
    assert count("replies", "used") - used == 1  # not asked again after the turn ended
    assert len(calls) == 1
    assert calls[0] == [*earlier, Turn("user", "book a table")]
    assert [(t.role, t.text) for t in h.session.history] == [
        ("user", "turn 2"),
        ("agent", "turn 3"),
        ("user", "book a table"),
        ("agent", "you said book a table"),
    ]
