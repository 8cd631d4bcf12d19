"""What goes to the LLM stays within a size: the oldest turns go first past the character
budget (a call with its results), the newest user turn always stays, a tool output too
long is cut with a note."""

from __future__ import annotations

from services.gateway.agent import ToolCall, Turn
from services.gateway.chat import chat_messages, clip, size

CALL = ToolCall("c1", "search_docs", '{"query": "manual"}')
DUMP = "lorem ipsum " * 4000  # 48 000 characters: a search result, a database dump


def conversation() -> list[Turn]:
    return [
        Turn("user", "please look up the manual"),
        Turn("agent", "", tool_calls=(CALL,)),
        Turn("tool", DUMP, call_id="c1"),
        Turn("agent", "Found it."),
        Turn("user", "what time is it?"),
        Turn("agent", "Noon."),
        Turn("user", "thanks"),
    ]


def test_a_long_output_is_cut_with_a_note_the_model_reads() -> None:
    assert clip("short", 10) == "short"
    cut = clip("x" * 50, 10)
    assert cut == "x" * 10 + "\n[output cut: 40 more characters not shown]"
    # cut where it entered the history, then again each time the history is sent: the
    # count stays the first cut's (it said 44 more characters the second time)
    assert clip(cut, 10) == cut
    assert clip(clip("x" * 500, 100), 100).endswith("[output cut: 400 more characters not shown]")


def test_the_oldest_turns_go_past_the_budget_a_call_with_its_result() -> None:
    """The 48 000-character result would make every later request too long for the model:
    past the budget it goes, with its call and what came before it."""
    messages = chat_messages(conversation(), "sys", 20, max_chars=1_000)
    assert messages == [
        {"role": "system", "content": "sys"},
        {"role": "assistant", "content": "Found it."},
        {"role": "user", "content": "what time is it?"},
        {"role": "assistant", "content": "Noon."},
        {"role": "user", "content": "thanks"},
    ]
    assert sum(size(m) for m in messages) <= 1_000


def test_a_call_and_its_result_stay_or_go_together() -> None:
    history = conversation()[:4]  # the call, its result, the answer
    history += [Turn("user", "and chapter 2?")]
    # room for the result's message but not for its call as well: both go
    budget = len("sys") + len(DUMP) + len("Found it.") + len("and chapter 2?")
    messages = chat_messages(history, "sys", 20, max_chars=budget)
    assert [m["role"] for m in messages] == ["system", "assistant", "user"]
    whole = chat_messages(history, "sys", 20, max_chars=budget + size_of_call())
    assert [m["role"] for m in whole] == ["system", "assistant", "tool", "assistant", "user"]


def size_of_call() -> int:
    return len(CALL.name) + len(CALL.arguments)


def test_the_newest_user_turn_and_what_follows_it_always_stay() -> None:
    """Even over the budget: without them there is nothing to answer (a client's tool
    result after the user's words included)."""
    history = [
        Turn("user", "old words"),
        Turn("user", "y" * 5_000),
        Turn("agent", "", tool_calls=(CALL,)),
        Turn("tool", "z" * 3_000, call_id="c1"),
    ]
    messages = chat_messages(history, "sys", 20, max_chars=1_000)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    assert messages[1]["content"] == "y" * 5_000


def test_tool_outputs_in_the_history_are_cut_too() -> None:
    """A client's result (conversation.tool_result), or a history saved before the cap."""
    messages = chat_messages(conversation(), "sys", 20, max_tool_chars=100)
    tool = next(m for m in messages if m["role"] == "tool")
    assert tool["content"].startswith(DUMP[:100]) and "more characters not shown" in tool["content"]


def test_without_a_budget_only_the_turn_count_cuts() -> None:
    assert len(chat_messages(conversation(), "sys", 20)) == 1 + 7
    assert chat_messages(conversation(), "sys", 2)[1:] == [
        {"role": "assistant", "content": "Noon."},
        {"role": "user", "content": "thanks"},
    ]
