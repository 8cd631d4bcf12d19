"""An agent with tools: the time anywhere, and a unit converter, on any OpenAI-compatible LLM.

As a gateway agent (sessions pick it with `{"agent": "assistant"}`, a Realtime client with
`model: "assistant"`, the page from its agent list):

    VA_GATEWAY__AGENTS=examples/tools_agent.py:create VA_LLM__BASE_URL=http://127.0.0.1:8080/v1 \\
        .venv/bin/voice-agent up

In a terminal, one question in text (the same agent, without the voice):

    VA_LLM__BASE_URL=http://127.0.0.1:8080/v1 .venv/bin/python examples/tools_agent.py \\
        "How far is 42 kilometres in miles?"

A tool is a typed Python function: `@tool` makes its JSON schema from the type hints (a
parameter's `Field(description=...)` included) and its description from the docstring;
the gateway checks the model's arguments against the same types before the call. Mark a
tool that changes something outside the conversation `@tool(side_effects=True)`: a reply
that runs it is then never prepared before the user has certainly finished speaking.
"""

from __future__ import annotations

import asyncio
import sys
from datetime import datetime
from pathlib import Path
from typing import Annotated, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.gateway.agent import AgentContext, Turn
from services.gateway.llm import LlmEndpoint, OpenAiAgent
from services.gateway.settings import GatewaySettings
from services.gateway.tools import ToolError, tool

Unit = Literal["km", "mi", "m", "ft", "kg", "lb", "l", "gal", "c", "f"]
TO_BASE: dict[str, tuple[str, float]] = {
    "km": ("m", 1000.0),
    "mi": ("m", 1609.344),
    "m": ("m", 1.0),
    "ft": ("m", 0.3048),
    "kg": ("kg", 1.0),
    "lb": ("kg", 0.45359237),
    "l": ("l", 1.0),
    "gal": ("l", 3.785411784),
}
PROMPT = (
    "You are a helpful voice assistant. Answer briefly, in plain spoken sentences. "
    "Use the tools for the current time and for unit conversions; never guess them."
)


@tool(timeout_s=1.0)
def current_time(
    timezone: Annotated[str, Field(description="IANA time zone, e.g. Europe/Paris")] = "UTC",
) -> str:
    """The current date and time in a time zone."""
    try:
        now = datetime.now(ZoneInfo(timezone))
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ToolError(f"unknown time zone {timezone!r}") from exc
    return now.strftime("%A %d %B %Y, %H:%M")


@tool(timeout_s=1.0)
def convert_units(
    value: float,
    from_unit: Annotated[Unit, Field(description="c and f are degrees Celsius and Fahrenheit")],
    to_unit: Unit,
) -> str:
    """Convert a length, weight, volume or temperature from one unit to another."""
    if {from_unit, to_unit} <= {"c", "f"}:
        celsius = value if from_unit == "c" else (value - 32) * 5 / 9
        result = celsius if to_unit == "c" else celsius * 9 / 5 + 32
    else:
        (base, factor), (target, divisor) = TO_BASE[from_unit], TO_BASE[to_unit]
        if base != target:
            raise ToolError(f"cannot convert {from_unit} to {to_unit}")
        result = value * factor / divisor
    return f"{value:g} {from_unit} is {result:.4g} {to_unit}"


def create(context: AgentContext) -> OpenAiAgent:
    """The gateway's factory (`VA_GATEWAY__AGENTS=examples/tools_agent.py:create`)."""
    return OpenAiAgent(
        context.llm, tools=[current_time, convert_units], name="assistant", system_prompt=PROMPT
    )


async def ask(question: str) -> str:
    """One question to the agent, without the voice: its answer, and the tools it used."""
    llm = LlmEndpoint(GatewaySettings().llm)
    agent = create(AgentContext(llm))
    said: list[str] = []
    try:
        await llm.probe()
        async for item in agent.respond([Turn("user", question)]):
            if isinstance(item, str):
                said.append(item)
            else:
                for call in item.calls:
                    print(f"[{type(item).__name__}] {call.name}({call.arguments})", file=sys.stderr)
    finally:
        await llm.aclose()
    return "".join(said)


if __name__ == "__main__":
    print(asyncio.run(ask(" ".join(sys.argv[1:]) or "What time is it in Tokyo?")))
