"""A reply's life, however it ends: once ended it sends and starts nothing, its work and TTS
jobs stop, and the history keeps what the user heard of it with the tools it ran.

Each test reproduces one way this went wrong: a cancel while `response.created` (or a
prepared reply's held events) was being written, an agent pausing longer than the TTS
timeout, a pause in the agent's text before a barge-in, a TTS chunk that failed, the link
dropping mid-answer, a reply's save overlapping the next reply, a session.update during a
pause, a client tool's result arriving before its response ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import pytest

from services.common.bus.messages import TtsJob
from services.common.protocol.events import SessionConfig, ToolSpec
from services.gateway.agent import (
    AGENTS,
    AgentOutput,
    ClientTools,
    ToolCall,
    ToolsAnswered,
    ToolsCalled,
    Turn,
)
from services.gateway.response import ResponseAudio
from services.gateway.settings import GatewaySection
from services.gateway.store import SessionStore
from services.gateway.turn_end import SilenceOnly
from tests.component import session_harness as harness
from tests.component.session_harness import (
    FakeBus,
    FakeSocket,
    Harness,
    on_virtual_time,
    running_session,
    scripted,
    silence,
    tone,
    tts_as,
)

BYTES_PER_S = 32000  # the harness's output: PCM16 at 16 kHz


async def until(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Until `condition` holds (virtual time: the steps cost no wall time)."""
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


def events_after_done(h: Harness, response_id: str) -> list[dict[str, Any]]:
    """What the client got for `response_id` after that response's `response.done`."""
    events = [e for _, e in h.socket.events]
    done = next(
        i
        for i, e in enumerate(events)
        if e["type"] == "response.done" and e["response_id"] == response_id
    )
    return [e for e in events[done + 1 :] if e.get("response_id") == response_id]


class _StallingSocket(FakeSocket):
    """A socket whose write of one kind of event (the `nth`) waits until the test lets it
    go: a slow client link pushing back while the session writes it."""

    kind = "response.created"
    nth = 1
    stalled: asyncio.Event
    go_on: asyncio.Event

    async def send_text(self, text: str) -> None:
        if json.loads(text)["type"] == self.kind:
            type(self).nth -= 1
            if self.nth == 0:
                self.stalled.set()
                with contextlib.suppress(TimeoutError):  # a failed test lets it go too
                    await asyncio.wait_for(self.go_on.wait(), 30)
        await super().send_text(text)


@contextmanager
def stalling(kind: str, nth: int = 1) -> Iterator[type[_StallingSocket]]:
    socket = type("Stalling", (_StallingSocket,), {"kind": kind, "nth": nth})
    socket.stalled, socket.go_on = asyncio.Event(), asyncio.Event()
    original = harness.FakeSocket
    harness.FakeSocket = socket  # type: ignore[misc]
    try:
        yield socket
    finally:
        harness.FakeSocket = original  # type: ignore[misc]


class _Asked:
    """An agent that records the last user turn of each history it answers, word by word."""

    asked: list[str]
    name = "echo"
    prepare_safe = True

    async def respond(
        self,
        history: list[Turn],
        instructions: str | None = None,
        client_tools: ClientTools | None = None,
    ) -> AsyncIterator[AgentOutput]:
        self.asked.append(history[-1].text)
        for word in f"You said {history[-1].text}. That is nice.".split():
            yield word + " "


def asking(asked: list[str]) -> dict[str, Any]:
    return {**AGENTS, "echo": type("Asking", (_Asked,), {"asked": asked})}


# ---------------------------------------------------------------------- a cancel mid-write


@on_virtual_time
async def test_a_reply_cancelled_while_its_created_is_written_never_runs() -> None:
    asked: list[str] = []
    settings = GatewaySection(prepare_replies=False)
    with stalling("response.created") as socket:
        async with running_session(
            settings=settings, agents=asking(asked), transcripts=["hello there"], asr_delay_s=1.0
        ) as h:
            await h.say(silence(200), tone(600), silence(700))
            await socket.stalled.wait()  # the voice turn's response.created is being written
            first = h.session.replies.current
            assert first is not None
            await h.send({"type": "conversation.text", "text": "actually, the weather?"})
            await until(lambda: first.done, timeout_s=5)  # cancelled meanwhile
            socket.go_on.set()
            await h.wait_for("response.done", 2)
    assert events_after_done(h, first.id) == []
    assert [e["status"] for e in h.of_type("response.done")] == ["cancelled", "completed"]
    assert asked == ["actually, the weather?"]  # the cancelled reply's agent never ran
    assert {job.response_id for _, job in h.bus.tts_jobs} == {
        h.of_type("response.created")[1]["response_id"]
    }


class _Holding(SilenceOnly):
    """Holds every turn a while for more speech: its answer begins when the hold runs out
    (a task of its own, not the client's input loop)."""

    async def hold_ms(self, history: list[Turn], transcript: str) -> int:
        return 500


@on_virtual_time
async def test_a_prepared_reply_cancelled_while_released_sends_nothing_after_its_end() -> None:
    asked: list[str] = []
    policy = _Holding(GatewaySection())
    with stalling("response.text.delta", nth=2) as socket:
        async with running_session(
            agents=asking(asked), transcripts=["book a table"], end_of_turn=policy
        ) as h:
            speaking = asyncio.create_task(h.say(silence(200), tone(900), silence(1200)))
            await socket.stalled.wait()  # the held text is being released
            reply = h.session.replies.current
            assert reply is not None
            await h.send({"type": "response.cancel"})
            await until(lambda: reply.done, timeout_s=5)
            socket.go_on.set()
            await h.wait_for("response.done")
            await speaking
            await asyncio.sleep(5)
    assert asked == ["book a table"]  # the prepared reply was the one released
    assert events_after_done(h, reply.id) == []
    assert h.of_type("response.done")[0]["status"] == "cancelled"
    assert h.socket.audio == []  # it never began to play


# ---------------------------------------------------------------------- slow agent, failed TTS

LOOKUP = ToolCall("call_1", "lookup", "{}")


async def _slow_tool() -> AsyncIterator[AgentOutput]:
    """Says a sentence, runs a slow tool (longer than the TTS timeout), then answers."""
    yield "Let me look that up for you."
    yield ToolsCalled((LOOKUP,))
    await asyncio.sleep(19.0)  # a 9 s tool and a 10 s second LLM round
    yield ToolsAnswered((LOOKUP,), ("42",))
    yield "The answer is forty two."


@on_virtual_time
async def test_an_agent_slower_than_the_tts_timeout_is_not_a_tts_failure() -> None:
    assert GatewaySection().tts_timeout_s < 19.0
    async with running_session(agents={**AGENTS, "echo": scripted(_slow_tool)}) as h:
        await h.send({"type": "conversation.text", "text": "what is it?"})
        done = await h.wait_for("response.done")
    assert h.of_type("error") == []
    assert done["status"] == "completed"
    assert done["text"] == "Let me look that up for you. The answer is forty two."
    assert h.session.history[1:] == [
        Turn("agent", "", tool_calls=(LOOKUP,)),
        Turn("tool", "42", call_id="call_1"),
        Turn("agent", "Let me look that up for you. The answer is forty two."),
    ]


async def _talks_on() -> AsyncIterator[AgentOutput]:
    """A sentence, then a few words every 5 s for a minute."""
    yield "First sentence is here. And"
    for _ in range(12):
        await asyncio.sleep(5.0)
        yield " a few more words."


@on_virtual_time
async def test_agent_text_gives_a_stalled_tts_no_more_time() -> None:
    async def stalled(bus: FakeBus, job: TtsJob) -> None:
        await asyncio.Event().wait()

    timeout_s = GatewaySection().tts_timeout_s
    assert timeout_s < 60.0
    with tts_as(stalled):
        async with running_session(agents={**AGENTS, "echo": scripted(_talks_on)}) as h:
            await h.send({"type": "conversation.text", "text": "go on"})
            done = await h.wait_for("response.done", timeout_s=120)
    assert [e["code"] for e in h.of_type("error")] == ["tts_unavailable"]
    assert done["status"] == "failed"
    first_job = h.bus.tts_jobs[0][0]
    assert h.time_of("response.done") - first_job == pytest.approx(timeout_s, abs=0.1)


@on_virtual_time
async def test_later_chunks_audio_gives_a_stalled_first_chunk_no_more_time() -> None:
    original = FakeBus._synthesize

    async def first_stalls(bus: FakeBus, job: TtsJob) -> None:
        if job.seq == 0:
            await asyncio.Event().wait()  # this worker hangs; the others answer
        await original(bus, job)

    timeout_s = GatewaySection().tts_timeout_s
    with tts_as(first_stalls):
        async with running_session(agents={**AGENTS, "echo": scripted(_talks_on)}) as h:
            await h.send({"type": "conversation.text", "text": "go on"})
            done = await h.wait_for("response.done", timeout_s=120)
    assert done["status"] == "failed" and h.audio_bytes() == 0
    first_job = h.bus.tts_jobs[0][0]
    assert h.time_of("response.done") - first_job == pytest.approx(timeout_s, abs=0.1)


async def _tool_then_stall() -> AsyncIterator[AgentOutput]:
    """A sentence, a tool, a second sentence whose TTS never answers, and more text later."""
    yield "Let me look that up for you."
    yield ToolsCalled((LOOKUP,))
    yield ToolsAnswered((LOOKUP,), ("42",))
    yield "The answer is forty two. Anything"
    await asyncio.sleep(30.0)
    yield " else I can do?"


@on_virtual_time
async def test_a_reply_whose_tts_times_out_stops_and_keeps_what_was_heard() -> None:
    original = FakeBus._synthesize

    async def synthesize(bus: FakeBus, job: TtsJob) -> None:
        if job.seq == 0:
            await original(bus, job)  # the second sentence is never answered

    with tts_as(synthesize):
        async with running_session(agents={**AGENTS, "echo": scripted(_tool_then_stall)}) as h:
            await h.send({"type": "conversation.text", "text": "what is it?"})
            done = await h.wait_for("response.done")
            await asyncio.sleep(60)  # the agent's later text would have come by now
    assert done["status"] == "failed"
    assert [e["code"] for e in h.of_type("error")] == ["tts_unavailable"]
    assert done["text"] == "Let me look that up for you."  # what played
    assert events_after_done(h, done["response_id"]) == []
    assert [job.text for _, job in h.bus.tts_jobs] == [
        "Let me look that up for you.",
        "The answer is forty two.",
    ]
    assert h.bus.is_cancelled(done["response_id"])  # the job still waiting is cancelled
    assert h.session.history[1:] == [
        Turn("agent", "", tool_calls=(LOOKUP,)),
        Turn("tool", "42", call_id="call_1"),
        Turn("agent", "Let me look that up for you."),
    ]


async def _three_sentences() -> AsyncIterator[AgentOutput]:
    yield "First sentence is here. Second sentence is lost. Third sentence is fine."


@on_virtual_time
async def test_a_sentence_whose_tts_failed_is_not_reported_as_said() -> None:
    original = FakeBus._synthesize

    async def synthesize(bus: FakeBus, job: TtsJob) -> None:
        if job.seq != 1:
            await original(bus, job)
        else:
            await asyncio.sleep(0.05)
            bus.deliver(job.failed("tts_unavailable", "engine crashed"), None)

    with tts_as(synthesize):
        async with running_session(agents={**AGENTS, "echo": scripted(_three_sentences)}) as h:
            await h.send({"type": "conversation.text", "text": "go"})
            done = await h.wait_for("response.done")
    said = "First sentence is here. Third sentence is fine."
    assert (done["status"], done["text"]) == ("completed", said)
    assert h.session.history[-1] == Turn("agent", said)


def test_heard_text_leaves_failed_chunks_out_and_counts_their_audio() -> None:
    audio = ResponseAudio("resp_1")
    for text in ("one two", "three four", "five six"):
        audio.add_text(text)
    audio.add_audio(0, 0, bytes(400))
    audio.finish_chunk(0, 1)
    audio.add_audio(1, 0, bytes(100))  # played, then its TTS failed
    audio.finish_chunk(1, 0, failed=True)
    audio.add_audio(2, 0, bytes(400))
    audio.finish_chunk(2, 1)
    while audio.next_audio() is not None:
        pass
    assert audio.text == "one two five six"
    assert audio.heard_text(500) == "one two"
    assert audio.heard_text(700) == "one two five"
    assert audio.heard_text(900) == "one two five six"


# ---------------------------------------------------------------------- heard after a pause

SENTENCE_1 = "One two three four five."
REST = " seven eight nine ten eleven twelve thirteen fourteen."


async def _gap() -> AsyncIterator[AgentOutput]:
    """Its text pauses mid-answer (a stalled LLM), longer than the audio before it."""
    yield SENTENCE_1 + " Six"
    await asyncio.sleep(4.0)
    yield REST


def played_by_client(audio: list[tuple[float, bytes]], until_s: float) -> list[float]:
    """When each frame starts to play at a client that plays what it gets at once, at real
    time, from a buffer (the first frame at once; a frame after a gap when it comes)."""
    starts, free_at = [], 0.0
    for sent_at, frame in audio:
        start = max(free_at, sent_at)
        starts.append(start)
        free_at = start + len(frame) / BYTES_PER_S
    return [s for s in starts if s < until_s]


@on_virtual_time
async def test_audio_after_a_pause_in_the_text_is_paced_and_heard_at_its_time() -> None:
    settings = GatewaySection()
    async with running_session(
        agents={**AGENTS, "echo": scripted(_gap)}, transcripts=["stop"]
    ) as h:
        await h.send({"type": "conversation.text", "text": "count"})
        await until(lambda: len(h.bus.tts_jobs) == 2)  # the text goes on after its pause
        resumed_at = h.bus.tts_jobs[1][0]
        await h.socket.changed.wait()
        await until(lambda: h.socket.audio[-1][0] > resumed_at)  # its audio began
        await h.say(tone(700), silence(900))  # barge in
        done = await h.wait_for("response.done")
        cleared = h.time_of("output_audio.clear")
    audio = [(t, a) for t, a in h.socket.audio if t <= cleared]
    # never more sent than the client has played, plus the lead
    lead_s = settings.output_lead_ms / 1000
    starts = played_by_client(audio, float("inf"))
    for i, (sent_at, _) in enumerate(audio):
        assert starts[i] - sent_at <= lead_s + 1e-6
    # what it heard by the barge-in: its first sentence and some words of the next, not all
    heard_s = sum(
        min(len(a) / BYTES_PER_S, cleared - s)
        for s, (_, a) in zip(played_by_client(audio, cleared), audio, strict=False)
    )
    first_s = 5 * 0.4  # the fake TTS: 400 ms a word
    words = len(SENTENCE_1.split()) + int(9 * (heard_s - first_s) / 3.6)
    assert done["status"] == "cancelled"
    assert len(done["text"].split()) <= words
    assert done["text"].startswith(SENTENCE_1)
    assert h.session.history[1] == Turn("agent", done["text"])


# ---------------------------------------------------------------------- the link drops

BOOK = ToolCall("call_1", "book_table", '{"people": 2}')
ANSWER = (
    "I booked a table for two at eight in the evening. "
    "Is there anything else I can help with today?"
)


async def _booking() -> AsyncIterator[AgentOutput]:
    yield ToolsCalled((BOOK,))
    yield ToolsAnswered((BOOK,), ("booked for 2 at 8pm",))
    yield ANSWER


class _Saves:
    """A store that records what each save held."""

    def __init__(self) -> None:
        self.saves: list[list[Turn]] = []

    async def save(
        self,
        config: SessionConfig,
        history: list[Turn],
        tenant: str,
        owed: str | None = None,
        taken: tuple[str, ...] = (),
    ) -> bool:
        self.saves.append(list(history))
        return True


async def _booking_cut(end: Callable[[Harness], Any]) -> tuple[Harness, _Saves]:
    store = _Saves()
    agents = {**AGENTS, "echo": scripted(_booking, prepare_safe=False)}
    async with running_session(agents=agents, store=cast(SessionStore, store)) as h:
        await h.send({"type": "conversation.text", "text": "book a table for two"})
        await until(lambda: h.audio_bytes() >= 3 * BYTES_PER_S)  # 3 s of it went out
        await end(h)
        await asyncio.sleep(1)
    return h, store


def _assert_kept_as_heard(h: Harness) -> None:
    history = h.session.history
    assert history[:3] == [
        Turn("user", "book a table for two"),
        Turn("agent", "", tool_calls=(BOOK,)),
        Turn("tool", "booked for 2 at 8pm", call_id="call_1"),
    ]
    assert len(history) == 4 and history[3].role == "agent"
    heard = history[3].text
    assert heard and ANSWER.startswith(heard) and heard != ANSWER
    assert h.of_type("response.done") == []  # nothing went to the client that left
    assert h.bus.is_cancelled(h.of_type("response.created")[0]["response_id"])


@on_virtual_time
async def test_a_reply_cut_by_a_dropped_link_is_kept_as_heard() -> None:
    async def hang_up(h: Harness) -> None:
        pass  # running_session's end: the client disconnects

    h, _ = await _booking_cut(hang_up)
    _assert_kept_as_heard(h)


@on_virtual_time
async def test_a_reply_cut_by_a_take_over_is_kept_as_heard() -> None:
    async def take_over(h: Harness) -> None:
        await h.session.take_over()

    h, store = await _booking_cut(take_over)
    _assert_kept_as_heard(h)
    assert store.saves[-1] == [Turn("user", "book a table for two")]  # the gateway saves last


# ---------------------------------------------------------------------- replies in order


class _SlowSaves(_Saves):
    """A store whose saves wait while `held` is clear (a slow Redis)."""

    def __init__(self) -> None:
        super().__init__()
        self.open = asyncio.Event()
        self.open.set()
        self.waiting = asyncio.Event()

    async def save(
        self,
        config: SessionConfig,
        history: list[Turn],
        tenant: str,
        owed: str | None = None,
        taken: tuple[str, ...] = (),
    ) -> bool:
        if not self.open.is_set():
            self.waiting.set()
            await self.open.wait()
        return await super().save(config, history, tenant)


@on_virtual_time
async def test_the_next_reply_begins_after_the_last_one_ended() -> None:
    store = _SlowSaves()
    async with running_session(store=cast(SessionStore, store)) as h:
        await h.send({"type": "response.create", "text": "Hello there."})
        await h.wait_for("response.created")
        store.open.clear()  # the reply's own save, at its end, is slow
        await store.waiting.wait()
        await h.send({"type": "response.create", "text": "And again."})
        await asyncio.sleep(1)
        store.open.set()
        await h.wait_for("response.done", 2)
    kinds = [
        (e["type"], e["response_id"])
        for _, e in h.socket.events
        if e["type"] in ("response.created", "response.done")
    ]
    first, second = (e["response_id"] for e in h.of_type("response.created"))
    assert kinds == [
        ("response.created", first),
        ("response.done", first),
        ("response.created", second),
        ("response.done", second),
    ]
    assert [t.text for t in h.session.history] == ["Hello there.", "And again."]


# ---------------------------------------------------------------------- prepared, then updated


@on_virtual_time
async def test_a_prepared_reply_is_not_used_after_a_session_update() -> None:
    heard: list[str | None] = []

    class Instructed:
        name = "echo"
        prepare_safe = True

        async def respond(
            self,
            history: list[Turn],
            instructions: str | None = None,
            client_tools: ClientTools | None = None,
        ) -> AsyncIterator[AgentOutput]:
            heard.append(instructions)
            yield f"Answer under {instructions}."

    agents = {**AGENTS, "echo": Instructed}
    async with running_session(agents=agents, transcripts=["book a table"]) as h:
        speaking = asyncio.create_task(h.say(silence(200), tone(900), silence(1200)))
        await until(lambda: len(heard) == 1)  # prepared during the pause
        await h.send({"type": "session.update", "session": {"instructions": "be brief"}})
        await speaking
        done = await h.wait_for("response.done")
    assert heard == [None, "be brief"]
    assert done["text"] == "Answer under be brief."


# ---------------------------------------------------------------------- a client tool's result

WEATHER = ToolCall("call_7", "get_weather", '{"city": "Paris"}')


async def _calls_client() -> AsyncIterator[AgentOutput]:
    yield "Let me check the weather for you in Paris right now."
    yield ToolsCalled((WEATHER,), client=True)


@on_virtual_time
async def test_a_client_tool_result_before_the_response_ends_follows_its_call() -> None:
    tool = ToolSpec(type="function", name="get_weather")
    config = SessionConfig(id="sess_test", output_sample_rate=16000, tools=[tool])
    async with running_session(
        agents={**AGENTS, "echo": scripted(_calls_client)}, config=config
    ) as h:
        await h.send({"type": "conversation.text", "text": "Weather in Paris?"})
        await h.wait_for("response.function_call")
        assert h.of_type("response.done") == []  # its audio still plays
        result = {"type": "conversation.tool_result", "call_id": "call_7", "output": "sunny"}
        await h.send(result)
        await h.wait_for("response.done")
    assert h.session.history == [
        Turn("user", "Weather in Paris?"),
        Turn("agent", "Let me check the weather for you in Paris right now."),
        Turn("agent", "", tool_calls=(WEATHER,)),
        Turn("tool", "sunny", call_id="call_7"),
    ]


async def _counts() -> AsyncIterator[AgentOutput]:
    """An agent that says one long sentence."""
    yield "One two three four five six seven eight nine ten eleven twelve thirteen."


@on_virtual_time
async def test_a_reply_cancelled_as_the_session_ends_is_kept_as_heard() -> None:
    """Another task cancels the reply (a transcript over it) and waits on Redis for its TTS
    jobs' cancel when the client hangs up: what was heard is in the history all the same,
    and the jobs are cancelled (the record used to come after that wait, and was lost with
    the task)."""
    store = _Saves()
    async with running_session(
        agents={**AGENTS, "echo": scripted(_counts)},
        store=cast(SessionStore, store),
        cancel_delay_s=0.5,
    ) as h:
        await h.send({"type": "conversation.text", "text": "count"})
        await until(lambda: h.audio_bytes() >= 2 * BYTES_PER_S)
        reply = h.session.replies.current
        assert reply is not None
        h.session._spawn(h.session.replies.cancel(), "transcript-over-it")
        await until(lambda: reply.done)
    said = [t for t in h.session.history if t.role == "agent"]
    assert said and said[0].text.startswith("One two"), h.session.history
    await until(lambda: h.bus.is_cancelled(reply.id))  # the cancel went on (shielded)


async def _stalls() -> AsyncIterator[AgentOutput]:
    """An agent with a greeting, then a long sentence whose TTS stalls after two pieces."""
    yield "Hi. The answer is forty two and it is a very long sentence indeed."


@on_virtual_time
async def test_a_sentence_cut_short_by_a_tts_stall_is_not_said_whole() -> None:
    """The TTS makes two 200 ms pieces of a 14-word sentence, then nothing: the reply fails,
    and its text and history hold at most the words those pieces can carry (the whole
    sentence used to be reported as said: its length was taken to be what had come)."""
    original = FakeBus._synthesize

    async def synthesize(bus: FakeBus, job: TtsJob) -> None:
        if job.seq == 0:
            await original(bus, job)
            return
        await asyncio.sleep(bus.tts_first_s)
        for index in range(2):
            bus.deliver(job.chunk(index), tone(bus.tts_piece_ms, job.sample_rate))
            await asyncio.sleep(bus.tts_chunk_s)
        await asyncio.Event().wait()  # stalled

    with tts_as(synthesize):
        async with running_session(agents={**AGENTS, "echo": scripted(_stalls)}) as h:
            await h.send({"type": "conversation.text", "text": "q"})
            done = await h.wait_for("response.done")
    assert done["status"] == "failed"
    assert done["text"].startswith("Hi.") and "indeed" not in done["text"], done


async def _hangs() -> AsyncIterator[AgentOutput]:
    """An agent that says one sentence, then neither speaks nor ends."""
    yield "Let me look that up. One"  # the sentence goes to TTS once more text follows
    await asyncio.Event().wait()
    yield "never said"


@on_virtual_time
async def test_an_agent_that_stalls_without_ending_fails_its_reply() -> None:
    """No audio owed by TTS and nothing more from the agent for `agent_idle_timeout_s`: the
    reply fails with `agent_failed`, keeps what was said, and the session goes on (the TTS
    timeout used to be the only bound, and no longer counts while TTS owes nothing)."""
    async with running_session(agents={**AGENTS, "echo": scripted(_hangs)}) as h:
        await h.send({"type": "conversation.text", "text": "look it up"})
        done = await h.wait_for("response.done", timeout_s=120)  # virtual: 60 s idle
        assert done["status"] == "failed" and done["text"] == "Let me look that up.", done
        assert [e["code"] for e in h.of_type("error")] == ["agent_failed"]
        await h.send({"type": "conversation.text", "text": "and now"})  # it goes on
        assert (await h.wait_for("response.created", count=2))["type"] == "response.created"
