"""Tools in a session (fake engines, virtual time): what is said before a tool call is
spoken while the tool runs; a client's call goes out as `response.function_call` and its
result comes back as `conversation.tool_result`; barge-in during a tool cancels it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from services.gateway import metrics as gateway_metrics
from services.gateway.agent import (
    AgentOutput,
    ClientTools,
    ToolCall,
    ToolsAnswered,
    ToolsCalled,
    Turn,
)
from tests.component.session_harness import on_virtual_time, running_session, silence, tone

CALL = ToolCall("call_1", "get_weather", '{"city": "Paris"}')


class ToolAgent:
    """Says a few words, calls a tool (its own, taking `tool_s`, or the client's), answers."""

    name = "echo"
    prepare_safe = True
    tool_s = 2.0
    seen: list[tuple[list[Turn], ClientTools | None]] = []  # noqa: RUF012

    async def respond(
        self,
        history: list[Turn],
        instructions: str | None = None,
        client_tools: ClientTools | None = None,
    ) -> AsyncIterator[AgentOutput]:
        ToolAgent.seen.append((list(history), client_tools))
        if history[-1].role == "tool":
            yield f"It is {history[-1].text}."
            return
        yield "Let me check the weather"  # no sentence end: only the tool call flushes it
        if client_tools is not None:
            yield ToolsCalled((CALL,), client=True)
            return
        yield ToolsCalled((CALL,))
        await asyncio.sleep(self.tool_s)  # the tool runs
        yield ToolsAnswered((CALL,), ("sunny",))
        yield "It is sunny."


@on_virtual_time
async def test_words_before_a_tool_call_are_spoken_while_it_runs() -> None:
    ToolAgent.seen.clear()
    async with running_session(agents={"echo": ToolAgent}, transcripts=["weather?"]) as h:  # type: ignore[dict-item]
        await h.say(silence(200), tone(600), silence(900))
        done = await h.wait_for("response.done", timeout_s=30)
        history = list(h.session.history)
    (first_at, first), (second_at, second) = h.bus.tts_jobs
    assert first.text == "Let me check the weather" and second.text == "It is sunny."
    assert second_at - first_at >= ToolAgent.tool_s  # the first went out before the tool ended
    # at once (prepared during the pause, even: the agent is prepare_safe), not after the tool
    assert first_at <= h.time_of("response.created")
    assert done["status"] == "completed" and done["text"] == "Let me check the weather It is sunny."
    assert [t.role for t in history] == ["user", "agent", "tool", "agent"]
    assert history[1].tool_calls == (CALL,) and history[2] == Turn(
        "tool", "sunny", call_id="call_1"
    )


@on_virtual_time
async def test_a_client_tool_round_trip_over_the_native_protocol() -> None:
    ToolAgent.seen.clear()
    tool = {"name": "get_weather", "description": "The weather.", "parameters": {"type": "object"}}
    async with running_session(agents={"echo": ToolAgent}) as h:  # type: ignore[dict-item]
        await h.send(
            {"type": "session.update", "session": {"tools": [tool], "tool_choice": "required"}}
        )
        updated = await h.wait_for("session.updated")
        await h.send({"type": "conversation.text", "text": "weather?"})
        call = await h.wait_for("response.function_call")
        done = await h.wait_for("response.done")
        await h.send({"type": "conversation.tool_result", "call_id": "nope", "output": "x"})
        error = await h.wait_for("error")
        await h.send({"type": "conversation.tool_result", "call_id": "call_1", "output": "rainy"})
        await h.send({"type": "response.create"})
        answer = await h.wait_for("response.done", 2)
    assert updated["session"]["tools"][0]["name"] == "get_weather"
    assert updated["session"]["tool_choice"] == "required"
    assert call == {
        "type": "response.function_call",
        "response_id": done["response_id"],
        "call_id": "call_1",
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
    }
    assert json.loads(call["arguments"]) == {"city": "Paris"}
    assert done["status"] == "completed" and done["text"] == "Let me check the weather"
    assert error["code"] == "invalid_message" and "nope" in error["message"]
    assert answer["status"] == "completed" and answer["text"] == "It is rainy."
    history, tools = ToolAgent.seen[-1]
    assert tools is not None and tools.choice == "required" and tools.tools[0].name == "get_weather"
    assert [t.role for t in history] == ["user", "agent", "agent", "tool"]


@on_virtual_time
async def test_barge_in_during_a_tool_call_cancels_the_reply_and_the_tool() -> None:
    ToolAgent.seen.clear()
    settings_agent = type("SlowTool", (ToolAgent,), {"tool_s": 30.0})
    async with running_session(
        agents={"echo": settings_agent}, transcripts=["weather?", "stop"]
    ) as h:  # type: ignore[dict-item]
        await h.say(silence(200), tone(600), silence(900))
        await h.wait_for("response.created")
        await h.say(silence(1500), tone(800), silence(900))  # the user speaks over it
        done = await h.wait_for("response.done", timeout_s=30)
        history = list(h.session.history)
    assert done["status"] == "cancelled"
    assert all(t.role != "tool" for t in history), history  # the tool never answered
    assert len(h.bus.tts_jobs) >= 1 and h.bus.tts_jobs[0][1].text == "Let me check the weather"


class QuickToolAgent(ToolAgent):
    tool_s = 0.1


@on_virtual_time
async def test_a_cut_off_answer_that_ran_a_tool_keeps_its_turns() -> None:
    """The user goes on at once over an answer whose tool already ran: the call and its
    result stay in the history, as they ran, and the new words are a turn of their own
    (not joined to the first: the tool answered that)."""
    ToolAgent.seen.clear()
    before = gateway_metrics.CUT_OFFS_JOINED._value.get()
    agents = {"echo": QuickToolAgent}
    async with running_session(agents=agents, transcripts=["weather?", "in paris"]) as h:  # type: ignore[arg-type]
        await h.say(silence(200), tone(600))
        while not h.socket.audio:
            await h.say(silence(20))
        await h.say(tone(700), silence(900))
        await h.wait_for("response.done", 2, timeout_s=30)
        history = list(h.session.history)
    assert h.of_type("response.done")[0]["status"] == "cancelled"
    roles = [(turn.role, bool(turn.tool_calls)) for turn in history]
    assert roles[:3] == [("user", False), ("agent", True), ("tool", False)]
    assert [t.text for t in history if t.role == "user"] == ["weather?", "in paris"]
    assert gateway_metrics.CUT_OFFS_JOINED._value.get() == before
