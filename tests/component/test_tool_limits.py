"""Tools that go wrong without harming anyone else: a plain tool that hangs holds a thread of
the tools' own pool (never asyncio's default executor, which DNS look-ups share); a full
pool, or a session's full share, answers at once; an exception's text stays in the
gateway; an output too long is cut."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections.abc import Iterator

import pytest

from services.gateway import metrics
from services.gateway.agent import ToolCall
from services.gateway.tools import SESSION, Tool, ToolLimits, ToolPool, run_call, run_calls, tool

HUNG = ToolCall("h", "fetch_order", '{"order_id": "1"}')
ADD = ToolCall("a", "add", '{"a": 1, "b": 2}')


@tool(timeout_s=2)
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at the end of the test: the hung tools return (their threads end)."""
    event = threading.Event()
    yield event
    event.set()


def hanging(release: threading.Event) -> Tool:
    @tool(name="fetch_order", timeout_s=0.05)
    def fetch_order(order_id: str) -> str:
        """Stands for a blocking HTTP call to a host that is down, without a timeout."""
        release.wait(30)
        return "late"

    return fetch_order


def error(output: str) -> str:
    return str(json.loads(output).get("error", ""))


async def test_hung_plain_tools_leave_other_calls_and_the_default_executor_alone(
    release: threading.Event,
) -> None:
    """As many hung calls as asyncio's default executor has threads: then a quick tool
    still answers, and so does anything else on that executor."""
    tools = {t.name: t for t in (hanging(release), add)}
    workers = min(32, (os.cpu_count() or 1) + 4)  # the default executor's size
    # every one of them hangs (a per-session share below `workers` would refuse some at
    # once, and the test would pass on the default executor too); one thread stays free
    limits = ToolLimits(timeout_s=10, pool=ToolPool(threads=workers + 1, per_session=workers))
    outputs = await run_calls(tools, [HUNG] * workers, limits)
    assert all(error(o) for o in outputs)
    assert {error(o) for o in outputs} == {"the tool did not answer within 0.05 s"}
    started = time.perf_counter()
    assert await run_calls(tools, [ADD], limits) == ["3"]
    assert await asyncio.wait_for(asyncio.to_thread(lambda: "free"), 1) == "free"
    assert time.perf_counter() - started < 5  # no wait for a hung call's thread (10 s)


async def test_a_full_pool_answers_at_once_and_counts_the_calls_it_gave_up_on(
    release: threading.Event,
) -> None:
    pool = ToolPool(threads=3, per_session=2)
    tools = {t.name: t for t in (hanging(release), add)}
    abandoned = metrics.TOOL_CALLS_ABANDONED._value.get()
    busy = metrics.TOOL_CALLS.labels("busy")._value.get()

    def limits(session: str) -> ToolLimits:
        return ToolLimits(timeout_s=10, pool=pool, owner=session)

    first = [error(o) for o in await run_calls(tools, [HUNG] * 3, limits("a"))]
    assert sorted(first) == [
        "the tool did not answer within 0.05 s",
        "the tool did not answer within 0.05 s",
        "the tool is not available now (this session already has 2 tools running); try again later",
    ]
    assert pool.busy == 2  # the timed-out calls still hold their threads
    assert metrics.TOOL_CALLS_ABANDONED._value.get() == abandoned + 2
    assert "did not answer" in error((await run_calls(tools, [HUNG], limits("b")))[0])
    started = time.perf_counter()
    refused = error((await run_calls(tools, [ADD], limits("c")))[0])
    # refused at once, not after the 10 s timeout (a bound a loaded machine keeps)
    assert "every tool thread is busy" in refused and time.perf_counter() - started < 5
    assert metrics.TOOL_CALLS.labels("busy")._value.get() == busy + 2
    release.set()  # the hung functions return: their threads are free again
    async with asyncio.timeout(5):
        while pool.busy:
            await asyncio.sleep(0.01)
    assert await run_calls(tools, [ADD], limits("c")) == ["3"]


async def test_calls_of_one_session_count_together_across_its_replies(
    release: threading.Event,
) -> None:
    pool = ToolPool(threads=8, per_session=2)
    tools = {t.name: t for t in (hanging(release), add)}
    token = SESSION.set("s1")
    try:
        for _ in range(2):  # two replies, each with a call that hangs
            await run_calls(tools, [HUNG], ToolLimits(pool=pool))
        assert "already has 2" in error((await run_calls(tools, [ADD], ToolLimits(pool=pool)))[0])
    finally:
        SESSION.reset(token)
    assert await run_calls(tools, [ADD], ToolLimits(pool=pool)) == ["3"]  # another session


async def test_an_exception_text_stays_in_the_gateway(caplog: pytest.LogCaptureFixture) -> None:
    """HTTP clients put the whole URL in their errors, API key and all: the model (and the
    history saved in Redis) gets the type; the log the text, URLs redacted."""

    @tool
    def weather(city: str) -> str:
        """Weather for a city."""
        raise ConnectionError(f"GET http://svc:pw123@api.example/v1/{city}?appid=KEY123 failed")

    caplog.set_level(logging.INFO)
    output = await run_call({"weather": weather}, ToolCall("c", "weather", '{"city": "Oslo"}'))
    assert json.loads(output) == {"error": "the tool failed (ConnectionError)"}
    assert "KEY123" not in caplog.text and "pw123" not in caplog.text
    # the query goes whole (the log filter, where a service installed it, says `[redacted]`)
    assert "ConnectionError: GET http://***@api.example/v1/Oslo?" in caplog.text
    assert "test_tool_limits.py:" in caplog.text  # where it was raised


async def test_a_long_output_is_cut_with_a_note() -> None:
    @tool
    def dump() -> str:
        """A search result of a whole manual."""
        return "lorem ipsum " * 4000

    call = ToolCall("c", "dump", "{}")
    default = await run_call({"dump": dump}, call, 10)
    assert len(default) < 16_100 and default.endswith("32000 more characters not shown]")
    short = await run_call({"dump": dump}, call, ToolLimits(max_output_chars=100))
    assert short == ("lorem ipsum " * 9)[:100] + "\n[output cut: 47900 more characters not shown]"
