"""Agents: what decides the reply. Chosen per session by name."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Literal, Protocol


@dataclass(frozen=True, slots=True)
class Turn:
    """One turn of the conversation; an agent turn holds what the user heard."""

    role: Literal["user", "agent"]
    text: str


class Agent(Protocol):
    """Produces the reply to the conversation as a stream of text deltas."""

    name: str
    prepare_safe: bool
    """Whether a reply may be started before the turn is certainly over and then thrown
    away unseen (the reply prepared during a pause): False for an agent whose reply has
    effects beyond its text (a tool that books, pays, sends)."""

    def respond(self, history: list[Turn], instructions: str | None = None) -> AsyncIterator[str]:
        """Text deltas of the reply to `history` (whose last turn is usually the user's).

        `instructions` is the session's own system prompt (`session.update`), kept in
        Redis with its history; None means the agent's configured default.
        """
        ...


class EchoAgent:
    """Says back what the user said last."""

    name = "echo"
    prepare_safe = True

    async def respond(
        self, history: list[Turn], instructions: str | None = None
    ) -> AsyncIterator[str]:
        for turn in reversed(history):
            if turn.role == "user":
                if turn.text.strip():
                    yield turn.text.strip()
                return


AGENTS: dict[str, Callable[[], Agent]] = {"echo": EchoAgent}
