"""Tools: schemas from type hints, calls that fail safely, and the `openai` agent's tool loop
against a real OpenAI-compatible server that streams its tool calls in pieces."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Annotated, Literal

import pytest
from pydantic import Field

from benchmarks.llm_server import LlmServer, Script, ToolRule
from services.common.errors import AgentFailed, InvalidMessage
from services.common.protocol.events import FunctionChoice, ToolSpec
from services.gateway.agent import (
    AgentContext,
    ClientTools,
    EchoAgent,
    ToolCall,
    ToolsAnswered,
    ToolsCalled,
    Turn,
    can_prepare,
    closing,
    load_agents,
)
from services.gateway.chat import chat_messages, size
from services.gateway.llm import LlmEndpoint, LlmSettings, OpenAiAgent
from services.gateway.tools import Tool, ToolError, run_call, tool
from tests.servers import ServerThread

WEATHER = ToolRule("weather", "get_weather", {"city": "Paris", "unit": "celsius"}, "Let me look.")


@tool
def get_weather(
    city: Annotated[str, Field(description="a city name")], unit: Literal["celsius", "fahrenheit"]
) -> dict[str, object]:
    """The weather in a city now.

    More words the model is not told."""
    return {"city": city, "sky": "sunny", "degrees": 21 if unit == "celsius" else 70}


@pytest.fixture(scope="module")
def llm() -> Iterator[tuple[LlmServer, ServerThread]]:
    script = Script(reply="No tools needed.", rules=(WEATHER,), answer="Here it is: {output}.")
    server = LlmServer(script)
    with ServerThread(server.app) as thread:
        yield server, thread


def endpoint(thread: ServerThread, **overrides: object) -> LlmEndpoint:
    return LlmEndpoint(LlmSettings(base_url=f"{thread.http}/v1", **overrides))  # type: ignore[arg-type]


def test_the_schema_comes_from_the_type_hints() -> None:
    assert get_weather.name == "get_weather"
    assert get_weather.description == "The weather in a city now."
    assert get_weather.parameters == {
        "type": "object",
        "properties": {
            "city": {"type": "string", "title": "City", "description": "a city name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "title": "Unit"},
        },
        "required": ["city", "unit"],
    }
    assert get_weather.spec()["function"]["parameters"] is get_weather.parameters


async def test_a_call_that_goes_wrong_is_an_error_result_never_an_exception() -> None:
    @tool(timeout_s=0.05)
    async def slow() -> str:
        """Never answers in time."""
        await asyncio.sleep(10)
        return "late"

    @tool
    def broken() -> str:
        """Raises."""
        raise RuntimeError("disk on fire")

    @tool
    async def refuses(order: str) -> str:
        """Tells the model something on purpose."""
        raise ToolError(f"there is no order {order}")

    tools = {t.name: t for t in (get_weather, slow, broken, refuses)}

    async def output(name: str, arguments: str) -> str:
        return await run_call(tools, ToolCall("c1", name, arguments), 5.0)

    ok = json.loads(await output("get_weather", '{"city": "Oslo", "unit": "fahrenheit"}'))
    assert ok == {"city": "Oslo", "sky": "sunny", "degrees": 70}
    assert "not valid JSON" in await output("get_weather", '{"city": ')
    assert "not valid JSON" in await output("get_weather", '{"city": ' + "7" * 5000 + "}")
    assert "must be a JSON object" in await output("get_weather", "[1]")
    invalid = json.loads(await output("get_weather", '{"city": "Oslo", "unit": "kelvin"}'))
    assert invalid["error"].startswith("invalid arguments: unit:")
    assert "there is no tool 'nope'" in await output("nope", "{}")
    assert "did not answer within 0.05 s" in await output("slow", "{}")
    assert json.loads(await output("broken", "{}")) == {"error": "the tool failed (RuntimeError)"}
    assert json.loads(await output("refuses", '{"order": "A7"}')) == {
        "error": "there is no order A7"  # a ToolError's words reach the model
    }


def test_prepare_safe_is_false_when_a_tool_has_side_effects() -> None:
    @tool(side_effects=True)
    def book_table(people: int) -> str:
        """Books a table."""
        return "booked"

    assert EchoAgent.prepare_safe and can_prepare(EchoAgent()) and can_prepare(object())
    assert OpenAiAgent(LlmSettings(), tools=[get_weather]).prepare_safe
    assert not OpenAiAgent(LlmSettings(), tools=[get_weather, book_table]).prepare_safe


async def test_a_tool_round_trip_speaks_before_the_call_and_answers_with_the_result(
    llm: tuple[LlmServer, ServerThread],
) -> None:
    server, thread = llm
    llm_endpoint = endpoint(thread, model="m")
    agent = OpenAiAgent(llm_endpoint, tools=[get_weather])
    try:
        items = [i async for i in agent.respond([Turn("user", "What's the weather in Paris?")])]
    finally:
        await llm_endpoint.aclose()
    called, answered = (i for i in items if not isinstance(i, str))
    before, after = items[: items.index(called)], items[items.index(answered) + 1 :]
    arguments = json.dumps(WEATHER.arguments)
    assert len(arguments) > 8, "the arguments stream in several pieces"
    assert isinstance(called, ToolsCalled) and not called.client
    assert [(c.name, c.arguments) for c in called.calls] == [("get_weather", arguments)]
    assert isinstance(answered, ToolsAnswered) and answered.calls == called.calls
    result = '{"city": "Paris", "sky": "sunny", "degrees": 21}'
    assert answered.outputs == (result,)
    assert "".join(before) == "Let me look."  # said before the call
    assert "".join(after) == f"Here it is: {result}."  # type: ignore[arg-type]
    first, second = (r.body for r in server.requests[-2:])
    assert first["tools"] == [get_weather.spec()] and first["tool_choice"] == "auto"
    assert second["messages"][-2] == {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {
                "id": called.calls[0].id,
                "type": "function",
                "function": {"name": "get_weather", "arguments": arguments},
            }
        ],
    }
    assert second["messages"][-1] == {
        "role": "tool",
        "tool_call_id": called.calls[0].id,
        "content": result,
    }
    # kept in the history, the exchange is sent again in later turns
    history = [Turn("user", "weather?"), *answered.turns(), Turn("agent", "Here it is.")]
    again = chat_messages(history, "sys", 20)
    assert again[2] == {k: v for k, v in second["messages"][-2].items() if k != "content"}
    assert again[3] == second["messages"][-1]


async def test_a_failing_tool_gives_the_model_an_error_and_the_reply_goes_on(
    llm: tuple[LlmServer, ServerThread],
) -> None:
    @tool(name="get_weather")
    def weather_down(city: str, unit: str) -> str:
        """Fails."""
        raise ConnectionError("weather service down")

    _, thread = llm
    llm_endpoint = endpoint(thread)
    try:
        items = [
            i
            async for i in OpenAiAgent(llm_endpoint, tools=[weather_down]).respond(
                [Turn("user", "weather please")]
            )
        ]
    finally:
        await llm_endpoint.aclose()
    said = "".join(i for i in items if isinstance(i, str))
    assert said.startswith("Let me look.Here it is: ")
    assert "ConnectionError" in said and "weather service down" not in said


async def test_a_huge_tool_output_does_not_poison_the_later_requests(
    llm: tuple[LlmServer, ServerThread],
) -> None:
    """48 000 characters of tool output: the model gets the first `max_tool_output_chars`
    (and reads that the rest is cut), the history keeps the same, and later requests leave
    the exchange out once it no longer fits `max_context_chars` (else every one of them
    would fail with the server's context-length error until it fell out of the window)."""

    @tool(name="get_weather")
    def weather_dump(city: str, unit: str) -> str:
        """A whole weather database."""
        return "lorem ipsum " * 4000

    server, thread = llm
    llm_endpoint = endpoint(thread, max_tool_output_chars=2_000, max_context_chars=2_000)
    agent = OpenAiAgent(llm_endpoint, tools=[weather_dump])
    try:
        items = [i async for i in agent.respond([Turn("user", "weather in Paris?")])]
    finally:
        await llm_endpoint.aclose()
    answered = next(i for i in items if isinstance(i, ToolsAnswered))
    output = answered.outputs[0]
    assert output.startswith("lorem ipsum") and output.endswith("46000 more characters not shown]")
    assert server.requests[-1].body["messages"][-1]["content"] == output
    history = [Turn("user", "weather in Paris?"), *answered.turns(), Turn("agent", "Sunny.")]
    history += [Turn("user", "and tomorrow?")]
    later = agent.messages(history)
    assert [m["role"] for m in later] == ["system", "assistant", "user"]
    assert sum(size(m) for m in later) <= 2_000


class AlwaysCalls(Script):
    """A server that ignores `tool_choice: none` (as several local servers do): it calls the
    tool in every round."""

    def plan(self, body: dict[str, object]) -> tuple[str, ToolRule | None]:
        return self.rules[0].preamble, self.rules[0]


@pytest.mark.parametrize("preamble", ["", "One moment."])
async def test_calls_in_the_last_round_are_not_run(preamble: str) -> None:
    """The last round may not call tools: a call made anyway is not run (a side effect
    would happen once more, and nothing would answer it); a reply left without words to
    end on fails (agent_failed), one with words ends on them."""
    runs: list[int] = []

    @tool(side_effects=True)
    def book_table(people: int) -> str:
        """Book a table."""
        runs.append(people)
        return "booked"

    rule = ToolRule("book", "book_table", {"people": 2}, preamble)
    server = LlmServer(AlwaysCalls(rules=(rule,)))
    with ServerThread(server.app) as thread:
        llm_endpoint = endpoint(thread, model="m", max_tool_rounds=2)
        agent = OpenAiAgent(llm_endpoint, tools=[book_table])
        items: list[object] = []
        try:
            if preamble:
                items = [i async for i in agent.respond([Turn("user", "book a table")])]
            else:
                with pytest.raises(AgentFailed, match="still called tools"):
                    async for item in agent.respond([Turn("user", "book a table")]):
                        items.append(item)
        finally:
            await llm_endpoint.aclose()
    assert runs == [2]  # the first round's call only
    assert [r.body["tool_choice"] for r in server.requests] == ["auto", "none"]
    assert [type(i).__name__ for i in items if not isinstance(i, str)] == [
        "ToolsCalled",
        "ToolsAnswered",
    ]
    assert "".join(i for i in items if isinstance(i, str)) == preamble * 2


async def test_barge_in_during_a_tool_call_cancels_the_tool(
    llm: tuple[LlmServer, ServerThread],
) -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    @tool(name="get_weather", timeout_s=60)
    async def forever(city: str, unit: str) -> str:
        """Waits."""
        started.set()
        try:
            await asyncio.sleep(60)
        finally:
            cancelled.set()
        return "never"

    _, thread = llm
    llm_endpoint = endpoint(thread)

    async def reply() -> None:
        agent = OpenAiAgent(llm_endpoint, tools=[forever])
        async with closing(agent.respond([Turn("user", "the weather?")])) as stream:
            async for _ in stream:
                pass

    task = asyncio.create_task(reply())
    await asyncio.wait_for(started.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await llm_endpoint.aclose()
    assert cancelled.is_set()


async def test_a_client_tool_call_ends_the_reply(llm: tuple[LlmServer, ServerThread]) -> None:
    server, thread = llm
    spec = ToolSpec(name="get_weather", description="d", parameters=get_weather.parameters)
    llm_endpoint = endpoint(thread)
    before = len(server.requests)
    try:
        items = [
            i
            async for i in OpenAiAgent(llm_endpoint).respond(
                [Turn("user", "weather in Paris?")], None, ClientTools((spec,), "required")
            )
        ]
    finally:
        await llm_endpoint.aclose()
    *said, called = items
    assert "".join(said) == "Let me look."  # type: ignore[arg-type]
    assert isinstance(called, ToolsCalled) and called.client
    assert json.loads(called.calls[0].arguments) == WEATHER.arguments
    assert len(server.requests) == before + 1  # the client runs it: no second model call
    sent = server.requests[-1].body
    assert (
        sent["tool_choice"] == "required" and sent["tools"][0]["function"]["name"] == "get_weather"
    )


async def test_a_tool_choice_naming_no_tool_is_refused_before_any_request(
    llm: tuple[LlmServer, ServerThread],
) -> None:
    server, thread = llm
    spec = ToolSpec(name="get_weather", description="d", parameters=get_weather.parameters)
    llm_endpoint = endpoint(thread)
    before = len(server.requests)
    try:
        with pytest.raises(InvalidMessage, match="'get_time'"):
            async for _ in OpenAiAgent(llm_endpoint).respond(
                [Turn("user", "what time is it?")],
                None,
                ClientTools((spec,), FunctionChoice(name="get_time")),
            ):
                pass
        served = OpenAiAgent(llm_endpoint, tools=[get_weather]).respond(
            [Turn("user", "weather in Paris?")],
            None,
            ClientTools((), FunctionChoice(name="get_weather")),
        )
        items = [item async for item in served]
        assert any(isinstance(i, ToolsAnswered) for i in items)  # the agent's own tool ran
    finally:
        await llm_endpoint.aclose()
    assert len(server.requests) == before + 2


def test_history_pairs_each_call_with_its_result() -> None:
    call, lost = ToolCall("c1", "get_weather", "{}"), ToolCall("c2", "get_weather", "{}")
    history = [
        Turn("user", "weather?"),
        Turn("agent", "", tool_calls=(call, lost)),  # c2 never got a result
        Turn("agent", "Let me look."),
        Turn("tool", "sunny", call_id="c1"),
        Turn("tool", "orphan", call_id="c9"),
        Turn("agent", "It is sunny."),
    ]
    messages = chat_messages(history, "sys", 20)
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "assistant",
    ]
    assert [c["id"] for c in messages[2]["tool_calls"]] == ["c1"]
    assert messages[3] == {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
    assert chat_messages(history, "sys", 2)[1:] == [
        {"role": "assistant", "content": "It is sunny."}
    ]


def test_agents_are_plugins(tmp_path: pytest.TempPathFactory) -> None:
    context = AgentContext(LlmEndpoint(LlmSettings()))
    loaded = load_agents(["examples/tools_agent.py:create"], context)
    agent = loaded["assistant"]()
    assert isinstance(agent, OpenAiAgent) and agent.prepare_safe
    assert sorted(agent.tools) == ["convert_units", "current_time"]
    for bad, match in (("nocolon", "package.module:factory"), ("no.such.module:f", "cannot be")):
        with pytest.raises(ValueError, match=match):
            load_agents([bad], context)


def test_the_example_tools_answer() -> None:
    from examples.tools_agent import convert_units, current_time

    assert isinstance(current_time, Tool) and isinstance(convert_units, Tool)
    assert convert_units.function(value=42, from_unit="km", to_unit="mi") == "42 km is 26.1 mi"
    assert convert_units.function(value=100, from_unit="c", to_unit="f") == "100 c is 212 f"
    assert "," in current_time.function(timezone="Asia/Tokyo")
    with pytest.raises(ValueError, match="cannot convert"):
        convert_units.function(value=1, from_unit="kg", to_unit="km")


def test_the_example_runs_in_a_terminal() -> None:
    """`python examples/tools_agent.py QUESTION` against a scripted LLM: the model calls the
    converter, the agent runs it and says the answer."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    rule = ToolRule("miles", "convert_units", {"value": 42, "from_unit": "km", "to_unit": "mi"})
    server = LlmServer(Script(rules=(rule,), answer="{output}."))
    root = Path(__file__).resolve().parents[2]
    with ServerThread(server.app) as thread:
        env = {**os.environ, "VA_LLM__BASE_URL": f"{thread.http}/v1"}
        done = subprocess.run(
            [sys.executable, "examples/tools_agent.py", "42 km in miles?"],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    assert done.stdout.strip() == "42 km is 26.1 mi."
    assert "convert_units" in done.stderr
    assert server.requests[0].body["model"] == "scripted"  # the probe found the served model
