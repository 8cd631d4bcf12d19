"""Agents: what decides the reply. Chosen per session by name.

An agent streams its reply as text deltas. One that uses tools also yields, between
them, what it did: `ToolsCalled` (the model asked for tools; the text so far is spoken
first) and `ToolsAnswered` (the results of the tools the gateway ran). A call of a tool
the *client* runs (`ToolsCalled(client=True)`) ends the reply: the client gets a
`response.function_call`, runs it and answers with `conversation.tool_result`.

Agents are plugins: `VA_GATEWAY__AGENTS` names factories (`package.module:factory`, each
called once with an `AgentContext`) whose agents join the built-in `echo` and `openai`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from services.common.protocol.events import ToolChoice, ToolSpec

if TYPE_CHECKING:
    from services.gateway.llm import LlmEndpoint


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call the model made: its id, the function and its arguments (JSON text)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Turn:
    """One turn of the conversation; an agent turn holds what the user heard.

    Tools: an agent turn with `tool_calls` is the model's calls (its text is empty), a
    `tool` turn the output of the call `call_id`.
    """

    role: Literal["user", "agent", "tool"]
    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    call_id: str | None = None


def keep_recent(history: list[Turn], max_turns: int) -> None:
    """Drop the oldest turns of `history` (in place) past `max_turns`."""
    if len(history) > max_turns:
        del history[: len(history) - max_turns]


@dataclass(frozen=True, slots=True)
class ToolsCalled:
    """The model called tools. The reply speaks its text so far before they run; calls of
    the client's tools (`client`) go to the client, and the reply ends."""

    calls: tuple[ToolCall, ...]
    client: bool = False


@dataclass(frozen=True, slots=True)
class ToolsAnswered:
    """The gateway ran these calls: with their outputs (in order) they join the history."""

    calls: tuple[ToolCall, ...]
    outputs: tuple[str, ...]

    def turns(self) -> list[Turn]:
        results = [
            Turn("tool", out, call_id=c.id) for c, out in zip(self.calls, self.outputs, strict=True)
        ]
        return [Turn("agent", "", tool_calls=self.calls), *results]


def reply_turns(said: str, tool_turns: list[Turn]) -> list[Turn]:
    """A reply's turns for the history: what the user heard of it (`said`, may be empty) and
    its tool turns. A reply that ended on a client's call said its words before the call;
    one whose tools the gateway ran says most after them (the answer)."""
    spoken = [Turn("agent", said)] if said else []
    if tool_turns and tool_turns[-1].role == "agent":  # ends on a call the client runs
        return [*spoken, *tool_turns]
    return [*tool_turns, *spoken]


AgentOutput = str | ToolsCalled | ToolsAnswered
"""What an agent's stream yields: text deltas, and the tools it used."""


@dataclass(frozen=True, slots=True)
class ClientTools:
    """The session's client tools and its `tool_choice`."""

    tools: tuple[ToolSpec, ...]
    choice: ToolChoice = "auto"


class Agent(Protocol):
    """Produces the reply to the conversation as a stream of text deltas (and tool steps)."""

    name: str

    @property
    def prepare_safe(self) -> bool:
        """Whether a reply may be started before the turn is certainly over and then thrown
        away unseen (the reply prepared during a pause): False for an agent whose reply has
        effects beyond its text (a tool that books, pays, sends: `side_effects=True`).
        Client tools do not count: their calls reach the client only once the reply is
        released. An agent that does not say is taken as safe (`can_prepare`)."""
        ...

    def respond(
        self,
        history: list[Turn],
        instructions: str | None = None,
        client_tools: ClientTools | None = None,
    ) -> AsyncIterator[AgentOutput]:
        """The reply to `history` (whose last turn is usually the user's).

        `instructions` is the session's own system prompt (`session.update`), kept in
        Redis with its history; None means the agent's configured default. `client_tools`
        are the session's (`session.update` `tools`); an agent that takes none may leave
        the parameter out: it is only passed when the session has some.
        """
        ...


class EchoAgent:
    """Says back what the user said last."""

    name = "echo"
    prepare_safe = True

    async def respond(
        self,
        history: list[Turn],
        instructions: str | None = None,
        client_tools: ClientTools | None = None,
    ) -> AsyncIterator[AgentOutput]:
        for turn in reversed(history):
            if turn.role == "user":
                if turn.text.strip():
                    yield turn.text.strip()
                return


AGENTS: dict[str, Callable[[], Agent]] = {"echo": EchoAgent}


def agent_stream(
    agent: Agent, history: list[Turn], instructions: str | None, client_tools: ClientTools | None
) -> AsyncIterator[AgentOutput]:
    """The agent's reply; `client_tools` only when there are some (agents written before
    tools existed take two arguments)."""
    if client_tools is None or not client_tools.tools:
        return agent.respond(history, instructions)
    return agent.respond(history, instructions, client_tools)


def can_prepare(agent: object) -> bool:
    """`agent.prepare_safe`; True for an agent that does not say (it runs no tools of ours)."""
    return bool(getattr(agent, "prepare_safe", True))


T = TypeVar("T")


@asynccontextmanager
async def closing(stream: AsyncIterator[T]) -> AsyncIterator[AsyncIterator[T]]:
    """Close an agent's stream when its reader stops, whatever stopped it: `async for`
    alone leaves a generator suspended (its HTTP stream open) until garbage collection."""
    try:
        yield stream
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()


# ---------------------------------------------------------------- plugins


@dataclass(frozen=True)
class AgentContext:
    """What an agent factory gets: the gateway's LLM (settings, one shared OpenAI client:
    one connection pool for every agent that talks to it) and the gateway's settings."""

    llm: LlmEndpoint
    settings: Any = None
    """The gateway's `GatewaySettings`."""


AgentFactory = Callable[[AgentContext], Agent]
"""`package.module:factory`: called once at start-up; its agent serves every session that
picks it (by its `name`), so it keeps no per-conversation state."""


def load_agents(specs: Sequence[str], context: AgentContext) -> dict[str, Callable[[], Agent]]:
    """The agents that `package.module:factory` (or `path/to/file.py:factory`) entries make,
    by name; a bad entry is a ValueError that names it (the gateway does not start)."""
    loaded: dict[str, Callable[[], Agent]] = {}
    for spec in specs:
        where, _, attribute = spec.rpartition(":")
        if not where or not attribute:
            raise ValueError(f"agent plugin {spec!r}: write it as package.module:factory")
        try:
            factory: AgentFactory = getattr(_module(where), attribute)
        except (ImportError, AttributeError, OSError) as exc:
            raise ValueError(f"agent plugin {spec!r} cannot be loaded: {exc}") from exc
        agent = factory(context)
        name = getattr(agent, "name", None)
        if not isinstance(name, str) or not name:
            raise ValueError(f"agent plugin {spec!r} made an agent without a `name`")
        loaded[name] = _same(agent)
    return loaded


def _module(where: str) -> ModuleType:
    """A module by its import name, or from a `.py` file (relative to the working folder)."""
    if not where.endswith(".py"):
        return importlib.import_module(where)
    path = Path(where).resolve()
    spec = importlib.util.spec_from_file_location(f"va_agent_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"no Python module at {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import would (dataclasses and pydantic look there)
    spec.loader.exec_module(module)
    return module


def _same(agent: Agent) -> Callable[[], Agent]:
    return lambda: agent
