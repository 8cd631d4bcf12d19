"""End-of-turn policies: after VAD silence and the transcript, answer now or hold on?

VAD decides that the user paused (`VA_VAD__MIN_SILENCE_MS`); a policy decides whether
the pause ended the turn. It sees the conversation and the new transcript and returns
how long to wait for more speech first: 0 answers at once. If the user speaks again
inside the hold, the gateway joins both utterances into one user turn and asks again.

A semantic turn model plugs in here: implement `EndOfTurn` and name it in
`VA_GATEWAY__END_OF_TURN` as `package.module:factory` (the factory gets the gateway
settings), or register it in `POLICIES`.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Protocol

from services.gateway.agent import Turn
from services.gateway.settings import GatewaySection


class EndOfTurn(Protocol):
    """Decides whether a transcript ends the user's turn."""

    name: str

    async def hold_ms(self, history: list[Turn], transcript: str) -> int:
        """Milliseconds to wait for more speech before answering (0: answer now).

        `history` ends with the user turn `transcript` belongs to.
        """
        ...


class SilenceOnly:
    """VAD silence alone ends the turn."""

    name = "silence"

    def __init__(self, settings: GatewaySection) -> None:
        del settings

    async def hold_ms(self, history: list[Turn], transcript: str) -> int:
        return 0


_WORD = re.compile(r"[a-z']+")

TRAILING_WORDS = frozenset(
    _WORD.findall(
        "and but or so because if then that which who when while although like um uh er "
        "erm hmm the a an to of for with my your our their about than as"
    )
)
"""Words a finished sentence rarely ends with: a pause after them is a pause mid-thought."""


class TrailingWordHeuristic:
    """Holds on when the transcript ends in a conjunction, article, preposition or filler."""

    name = "heuristic"

    def __init__(self, settings: GatewaySection) -> None:
        self.hold = settings.end_of_turn_hold_ms

    async def hold_ms(self, history: list[Turn], transcript: str) -> int:
        words = _WORD.findall(transcript.lower())
        return self.hold if words and words[-1] in TRAILING_WORDS else 0


Factory = Callable[[GatewaySection], EndOfTurn]

POLICIES: dict[str, Factory] = {"silence": SilenceOnly, "heuristic": TrailingWordHeuristic}


def create_policy(settings: GatewaySection) -> EndOfTurn:
    """The policy `settings.end_of_turn` names: a registered name or `module:factory`."""
    name = settings.end_of_turn
    if name in POLICIES:
        return POLICIES[name](settings)
    module_name, _, attribute = name.partition(":")
    if not attribute:
        choices = ", ".join(sorted(POLICIES))
        raise ValueError(f"unknown end-of-turn policy {name!r}; choose {choices} or module:factory")
    factory: Factory = getattr(importlib.import_module(module_name), attribute)
    return factory(settings)
