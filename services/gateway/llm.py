"""The `openai` agent: any OpenAI-compatible `/v1/chat/completions` with streaming.

Works with vLLM, llama.cpp's server, Ollama and OpenAI itself. Tokens stream back as
text deltas, so the gateway sends sentences to TTS while the model is still writing.
A failure or a timeout raises AgentFailed; the session goes on.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
from pydantic import BaseModel, Field, SecretStr

from services.common.errors import AgentFailed
from services.gateway.agent import Turn


class LlmSettings(BaseModel):
    """The OpenAI-compatible chat model behind the `openai` agent."""

    base_url: str = "http://127.0.0.1:8080/v1"
    """Base URL of the chat completions API (…/v1)."""
    api_key: SecretStr = SecretStr("")
    """Bearer token, if the server wants one."""
    model: str = "default"
    """Model name sent with each request."""
    system_prompt: str = (
        "You are a helpful voice assistant. Answer briefly, in plain spoken sentences."
    )
    """System prompt of conversations that set none (`instructions` in `session.update`)."""
    temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    """Sampling temperature."""
    max_tokens: int = Field(default=256, ge=1, le=8192)
    """Longest reply in tokens."""
    first_token_timeout_s: float = Field(default=10.0, ge=0.1, le=300)
    """Give up (agent_failed) when the first token takes longer than this."""
    token_timeout_s: float = Field(default=10.0, ge=0.1, le=300)
    """Give up when the stream stalls for longer than this between tokens."""
    history_turns: int = Field(default=20, ge=0, le=1000)
    """How many past turns are sent along."""


class OpenAiAgent:
    """Streams a reply from an OpenAI-compatible chat completions endpoint."""

    name = "openai"
    prepare_safe = True  # no tools: its reply is only text

    def __init__(self, settings: LlmSettings, client: httpx.AsyncClient | None = None) -> None:
        self.settings = settings
        self.client = client or httpx.AsyncClient(timeout=30.0)

    def messages(
        self, history: list[Turn], instructions: str | None = None
    ) -> list[dict[str, str]]:
        """The chat messages for a conversation (agent turns hold what the user heard)."""
        recent = history[-self.settings.history_turns :] if self.settings.history_turns else []
        system = instructions if instructions else self.settings.system_prompt
        chat = [{"role": "system", "content": system}]
        chat += [
            {"role": "user" if turn.role == "user" else "assistant", "content": turn.text}
            for turn in recent
        ]
        return chat

    async def respond(
        self, history: list[Turn], instructions: str | None = None
    ) -> AsyncIterator[str]:
        settings = self.settings
        headers = {"Accept": "text/event-stream"}
        key = settings.api_key.get_secret_value()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        body = {
            "model": settings.model,
            "messages": self.messages(history, instructions),
            "stream": True,
            "temperature": settings.temperature,
            "max_tokens": settings.max_tokens,
        }
        url = settings.base_url.rstrip("/") + "/chat/completions"
        try:
            async with self.client.stream(
                "POST",
                url,
                json=body,
                headers=headers,
                timeout=httpx.Timeout(
                    settings.first_token_timeout_s, read=settings.token_timeout_s
                ),
            ) as response:
                if response.status_code != 200:
                    detail = (await response.aread())[:200].decode(errors="replace")
                    raise AgentFailed(f"the LLM answered {response.status_code}: {detail}")
                async for delta in _deltas(response.aiter_lines()):
                    yield delta
        except httpx.TimeoutException as exc:
            raise AgentFailed(f"the LLM timed out ({type(exc).__name__})") from exc
        except httpx.HTTPError as exc:
            raise AgentFailed(f"the LLM is unreachable: {exc}") from exc


async def _deltas(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """Text deltas of an OpenAI server-sent-event stream."""
    async for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            chunk = json.loads(data)
            delta = chunk["choices"][0].get("delta", {}).get("content") or ""
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise AgentFailed(f"the LLM sent a malformed stream chunk: {data[:100]}") from exc
        if delta:
            yield delta
