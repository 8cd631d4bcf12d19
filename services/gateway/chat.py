"""A conversation's history as chat completions messages, within a size the model can take.

Tool calls need care: the API refuses an assistant message with `tool_calls` that is not
followed by a `tool` message for each call. The history may hold a call without its
result (a client that never answered, a reply cut during the call, a window that cut the
pair), so each call is placed with its result right after it, and a call without one (or a
result without its call) is left out.

Size: the window is the last `history_turns` turns, and then no more characters than
`max_chars` (the system prompt included): the oldest messages go first, a call always
with its results, and the newest user message (with what follows it) always stays. A tool
output longer than `max_tool_chars` is cut, with a note the model can read.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from services.gateway.agent import ToolCall, Turn

Message = dict[str, Any]


_CUT = re.compile(r"\n\[output cut: \d+ more characters not shown\]\Z")
"""The note `clip` ends a cut text with."""


def clip(text: str, max_chars: int) -> str:
    """`text`, cut to its first `max_chars` characters with a note saying how much is left
    out (the model then knows the output is incomplete). A text it cut already is left as
    it is: a tool output is cut where it enters the history and again each time the
    history is sent, and the second cut must not count the first's note as output."""
    if len(text) <= max_chars:
        return text
    note = _CUT.search(text)
    if note is not None and note.start() <= max_chars:
        return text
    return f"{text[:max_chars]}\n[output cut: {len(text) - max_chars} more characters not shown]"


def chat_messages(
    history: list[Turn],
    system: str,
    history_turns: int,
    max_chars: int | None = None,
    max_tool_chars: int | None = None,
) -> list[Message]:
    """System prompt, then the last `history_turns` turns as chat messages, the oldest left
    out while they are over `max_chars` (None: no limit)."""
    recent = history[-history_turns:] if history_turns else []
    groups = _groups(recent, max_tool_chars)
    system_message: Message = {"role": "system", "content": system}
    if max_chars is not None:
        groups = _within(groups, max_chars - size(system_message))
    return [system_message, *(m for group in groups for m in group)]


def size(message: Message) -> int:
    """Characters of a message that count against the window: its text and its calls."""
    calls = message.get("tool_calls") or ()
    return len(message.get("content") or "") + sum(
        len(c["function"]["name"]) + len(c["function"]["arguments"]) for c in calls
    )


def _groups(turns: list[Turn], max_tool_chars: int | None) -> list[list[Message]]:
    """The turns as messages, in groups that stay or go together: a message, or a call
    with its results."""
    results = {t.call_id: t.text for t in turns if t.role == "tool" and t.call_id}
    groups: list[list[Message]] = []
    for turn in turns:
        if turn.role == "user":
            groups.append([{"role": "user", "content": turn.text}])
        elif turn.role == "agent" and turn.tool_calls:
            answered = [c for c in turn.tool_calls if c.id in results]
            if answered:
                outputs = [results[c.id] for c in answered]
                if max_tool_chars is not None:
                    outputs = [clip(out, max_tool_chars) for out in outputs]
                groups.append(tool_exchange(answered, outputs))
        elif turn.role == "agent" and turn.text:
            groups.append([{"role": "assistant", "content": turn.text}])
    return groups


def tool_exchange(
    calls: Sequence[ToolCall], outputs: Sequence[str], text: str = ""
) -> list[Message]:
    """The model's turn with its calls (and the words it said before them), then each
    call's result: the messages of one tool round."""
    assistant: Message = {
        "role": "assistant",
        "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ],
    }
    if text:
        assistant["content"] = text
    results = [
        {"role": "tool", "tool_call_id": c.id, "content": out}
        for c, out in zip(calls, outputs, strict=True)
    ]
    return [assistant, *results]


def _within(groups: list[list[Message]], budget: int) -> list[list[Message]]:
    """The newest groups that fit in `budget` characters; the newest user message and
    what follows it stay whatever their size (without them there is nothing to answer)."""
    last_user = max(
        (i for i, g in enumerate(groups) if g[0]["role"] == "user"), default=len(groups)
    )
    start = len(groups)
    used = 0
    while start > 0:
        cost = sum(size(m) for m in groups[start - 1])
        if start - 1 < last_user and used + cost > budget:
            break
        used += cost
        start -= 1
    return groups[start:]
