"""A conversation's history as chat completions messages.

Tool calls need care: the API refuses an assistant message with `tool_calls` that is not
followed by a `tool` message for each call. The history may hold a call without its
result (a client that never answered, a reply cut during the call, a window that cut the
pair), so each call is placed with its result right after it, and a call without one (or a
result without its call) is left out.
"""

from __future__ import annotations

from typing import Any

from services.gateway.agent import Turn


def chat_messages(history: list[Turn], system: str, history_turns: int) -> list[dict[str, Any]]:
    """System prompt, then the last `history_turns` turns as chat messages."""
    recent = history[-history_turns:] if history_turns else []
    results = {t.call_id: t.text for t in recent if t.role == "tool" and t.call_id}
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for turn in recent:
        if turn.role == "user":
            messages.append({"role": "user", "content": turn.text})
        elif turn.role == "agent" and turn.tool_calls:
            answered = [c for c in turn.tool_calls if c.id in results]
            if not answered:
                continue
            messages.append(
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.name, "arguments": c.arguments},
                        }
                        for c in answered
                    ],
                }
            )
            messages += [
                {"role": "tool", "tool_call_id": c.id, "content": results[c.id]} for c in answered
            ]
        elif turn.role == "agent" and turn.text:
            messages.append({"role": "assistant", "content": turn.text})
    return messages
