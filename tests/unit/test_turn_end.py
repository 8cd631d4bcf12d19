"""End-of-turn policies: the built-ins and plugging in your own by import path."""

from __future__ import annotations

import pytest

from services.gateway.agent import Turn
from services.gateway.settings import GatewaySection
from services.gateway.turn_end import (
    SilenceOnly,
    TrailingWordHeuristic,
    create_policy,
    word_rules_apply,
)


class HalfSecond:
    """A plug-in policy, as a user would write one."""

    name = "half-second"

    def __init__(self, settings: GatewaySection) -> None:
        self.settings = settings

    async def hold_ms(self, history: list[Turn], transcript: str) -> int:
        return 500


@pytest.mark.parametrize(
    ("text", "held"),
    [
        ("I would like a coffee", False),
        ("I would like a coffee and", True),
        ("take me to the", True),
        ("so um", True),
        ("Because.", True),
        ("What is the weather like in", True),  # prepositions rarely end a sentence
        ("My flight leaves at seven, and I", True),
        ("What is the weather like in Paris?", False),
        ("", False),
    ],
)
async def test_heuristic_holds_after_a_trailing_word(text: str, held: bool) -> None:
    policy = TrailingWordHeuristic(GatewaySection(end_of_turn_hold_ms=650))
    assert await policy.hold_ms([Turn("user", text)], text) == (650 if held else 0)


async def test_policies_by_name_and_by_import_path() -> None:
    assert isinstance(create_policy(GatewaySection()), SilenceOnly)
    heuristic = create_policy(GatewaySection(end_of_turn="heuristic"))
    assert isinstance(heuristic, TrailingWordHeuristic)
    plugged = create_policy(GatewaySection(end_of_turn="tests.unit.test_turn_end:HalfSecond"))
    assert isinstance(plugged, HalfSecond) and await plugged.hold_ms([], "x") == 500


def test_an_unknown_policy_names_the_choices() -> None:
    """Refused when the settings are read (`doctor` and `up` say so, not the gateway's
    start-up); `create_policy` refuses it too, for settings built without validation."""
    choices = "choose auto, smart-turn, silence, heuristic or module:factory"
    with pytest.raises(ValueError, match=choices):
        GatewaySection(end_of_turn="semantic")
    with pytest.raises(ValueError, match=choices):
        create_policy(GatewaySection.model_construct(end_of_turn="semantic"))


@pytest.mark.parametrize(
    ("language", "applies"),
    [(None, True), ("en", True), ("EN", True), ("en-GB", True), ("de", False), ("fr", False)],
)
def test_word_rules_judge_english_and_unnamed_languages_only(
    language: str | None, applies: bool
) -> None:
    assert word_rules_apply(language) is applies
