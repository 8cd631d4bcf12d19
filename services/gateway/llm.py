"""The `openai` agent: any OpenAI-compatible chat completions API, on the official client.

Works with vLLM, llama.cpp's server, Ollama and OpenAI itself (`AsyncOpenAI`, streaming):
tokens stream back as text deltas, so the gateway sends sentences to TTS while the model
is still writing. Tools: the model's calls stream in pieces and are assembled here; the
gateway runs its own (services/gateway/tools.py), feeds the results back and streams the
answer; a call of a client tool goes to the client and ends the reply. A request that
fails before its stream starts is retried here (not by the SDK: a server's Retry-After
past the first-token deadline ends it at once); a failure or a timeout then raises
AgentFailed and the session goes on. What is sent is bounded (chat.py): the turns that
fit `max_context_chars`, each tool output cut at `max_tool_output_chars`. Closing the
stream (barge-in, a reply dropped) closes the HTTP response at once.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import math
import random
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import openai
from openai import AsyncOpenAI
from pydantic import BaseModel, Field, SecretStr

from services.common.errors import AgentFailed, InvalidMessage
from services.common.protocol.events import ToolChoice, ToolSpec
from services.common.redact import redact_url, redact_urls
from services.gateway import metrics
from services.gateway.agent import (
    AgentOutput,
    ClientTools,
    ToolCall,
    ToolsAnswered,
    ToolsCalled,
    Turn,
)
from services.gateway.chat import chat_messages, tool_exchange
from services.gateway.tools import SESSION, Tool, ToolLimits, ToolPool, run_calls

log = logging.getLogger(__name__)

OPENAI_URL = "https://api.openai.com/v1"
OPENAI_MODEL = "gpt-4o-mini"
"""The model asked of OpenAI's own API when `VA_LLM__MODEL` is unset."""
NO_KEY = "no-key"
"""Sent as the bearer token when none is configured (the SDK wants one; keyless servers
ignore it)."""


class LlmSettings(BaseModel):
    """The OpenAI-compatible chat model behind the `openai` agent (and agents built on it).

    Unset, `base_url` and `api_key` are read from `OPENAI_BASE_URL` and `OPENAI_API_KEY`."""

    base_url: str | None = Field(default=None, max_length=2048)
    """Base URL of the chat completions API (…/v1), e.g. `http://127.0.0.1:8080/v1` for
    llama.cpp's server. Unset: `OPENAI_BASE_URL`, else OpenAI's own API when an API key
    is set, else no LLM (the `echo` agent answers by default)."""
    api_key: SecretStr | None = None
    """Bearer token, if the server wants one (unset: `OPENAI_API_KEY`)."""
    model: str | None = Field(default=None, max_length=256)
    """Model name sent with each request. Unset: the first model the server lists at
    start-up (`gpt-4o-mini` on OpenAI's API)."""
    system_prompt: str = (
        "You are a helpful voice assistant. Answer briefly, in plain spoken sentences."
    )
    """System prompt of conversations that set none (`instructions` in `session.update`)."""
    temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    """Sampling temperature."""
    max_tokens: int = Field(default=256, ge=1, le=8192)
    """Longest reply in tokens (each model call of a reply with tools)."""
    first_token_timeout_s: float = Field(default=10.0, ge=0.1, le=300)
    """Give up (agent_failed) when the first token takes longer than this (retries included)."""
    token_timeout_s: float = Field(default=10.0, ge=0.1, le=300)
    """Give up when the stream stalls for longer than this between tokens."""
    max_retries: int = Field(default=1, ge=0, le=10)
    """Retries of a request that fails before its stream starts (connection errors, 408, 409,
    429, 5xx), within `first_token_timeout_s`: a server's Retry-After past it ends the
    request at once (a 429 says `rate limiting`)."""
    history_turns: int = Field(default=20, ge=0, le=1000)
    """How many past turns are sent along (at most: see `max_context_chars`)."""
    max_context_chars: int = Field(default=64_000, ge=1_000, le=10_000_000)
    """Characters sent to the model at most (system prompt, turns, tool calls and outputs;
    about 4 a token): the oldest turns are left out past it, never the newest user turn.
    Lower it for a model with a small context window."""
    max_tool_output_chars: int = Field(default=16_000, ge=100, le=1_000_000)
    """A tool output longer than this is cut (with a note saying so) before the model and
    the history get it."""
    tool_timeout_s: float = Field(default=10.0, ge=0.01, le=600)
    """A server-side tool that takes longer gives the model an error result instead."""
    tool_threads: int = Field(default=32, ge=1, le=1024)
    """Threads for plain (sync) tools, shared by every session: a call that finds none free
    (hung tools keep theirs past their timeout) gets an error result at once."""
    tool_calls_per_session: int = Field(default=4, ge=1, le=1024)
    """Plain tools one session may have running at once (timed-out ones still running
    included); more get an error result at once."""
    max_tool_rounds: int = Field(default=4, ge=1, le=32)
    """Model calls with tools in one reply; the last may not call tools (it must answer:
    calls it makes anyway are not run, and a last call without words fails the reply)."""
    probe_timeout_s: float = Field(default=2.0, ge=0.1, le=60)
    """At start-up, how long `GET /models` may take for the LLM to count as answering."""


class LlmRateLimited(AgentFailed):
    """The LLM answered 429 and asked for a wait longer than the reply can take (or the
    retries ran out): a non-fatal `agent_failed` that says so."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def make_client(settings: LlmSettings) -> AsyncOpenAI:
    """The OpenAI client for these settings (nothing read from the environment here: the
    settings already hold `OPENAI_BASE_URL`/`OPENAI_API_KEY` when they apply). User info in
    the URL becomes the HTTP client's basic auth, as httpx would make it, so that no URL it
    logs holds the password."""
    key = settings.api_key.get_secret_value() if settings.api_key is not None else ""
    url, credentials = _credentials(settings.base_url or OPENAI_URL)
    http_client = openai.DefaultAsyncHttpxClient(auth=credentials) if credentials else None
    return AsyncOpenAI(
        api_key=key or NO_KEY,
        base_url=url,
        timeout=openai.Timeout(settings.token_timeout_s, connect=settings.first_token_timeout_s),
        max_retries=settings.max_retries,
        http_client=http_client,
    )


def _credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """The URL without its user info, and that user info (decoded), if any."""
    parts = urlsplit(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    if not at:
        return url, None
    user, _, password = userinfo.partition(":")
    bare = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return bare, (unquote(user), unquote(password))


class LlmEndpoint:
    """The chat model every LLM agent of a gateway shares: its settings, one client (one
    connection pool), and the model name, settled by the start-up probe."""

    def __init__(self, settings: LlmSettings, client: AsyncOpenAI | None = None) -> None:
        self.settings = settings
        self.client = client or make_client(settings)
        self.single = self.client.with_options(max_retries=0)
        """The same client (one connection pool) without the SDK's retries: the agent
        retries itself, within the first-token deadline."""
        self.tool_pool = ToolPool(settings.tool_threads, settings.tool_calls_per_session)
        """The threads plain tools of every agent on this endpoint run on."""
        official = settings.base_url is None
        self.model = settings.model or (OPENAI_MODEL if official else "default")
        self.configured = settings.base_url is not None or settings.api_key is not None
        """An LLM was configured (a URL, or a key for OpenAI's own API)."""

    @property
    def url(self) -> str:
        """Where the LLM is, for people: no user info, no query string (`redact_url`);
        requests go to the configured URL."""
        return redact_url(self.settings.base_url or OPENAI_URL, mark="")

    async def probe(self) -> str | None:
        """Ask the server for its models (`GET /models`, bounded by `probe_timeout_s`);
        None when it answered, else why not. An unset model becomes the first listed."""
        try:
            async with asyncio.timeout(self.settings.probe_timeout_s):
                page = await self.single.models.list()
        except TimeoutError:
            return f"no answer within {self.settings.probe_timeout_s:g} s"
        except openai.APIError as exc:
            return _reason(exc)
        models = [m.id for m in page.data]
        if self.settings.model is None and self.settings.base_url is not None and models:
            self.model = models[0]
        return None

    async def aclose(self) -> None:
        await self.client.close()


@dataclass
class _Step:
    """What one model call produced: its text, and its tool calls assembled from pieces."""

    text: str = ""
    pieces: dict[int, dict[str, str]] = field(default_factory=dict)

    def add(self, deltas: Sequence[Any]) -> None:
        for delta in deltas:
            call = self.pieces.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            if delta.id:
                call["id"] = delta.id
            function = delta.function
            if function is not None:
                call["name"] += function.name or ""
                call["arguments"] += function.arguments or ""

    def calls(self) -> tuple[ToolCall, ...]:
        return tuple(
            ToolCall(c["id"] or f"call_{i}", c["name"], c["arguments"])
            for i, c in sorted(self.pieces.items())
        )


class OpenAiAgent:
    """Streams a reply from an OpenAI-compatible chat completions endpoint, with tools."""

    def __init__(
        self,
        llm: LlmEndpoint | LlmSettings,
        tools: Sequence[Tool] = (),
        name: str = "openai",
        system_prompt: str | None = None,
    ) -> None:
        self.llm = llm if isinstance(llm, LlmEndpoint) else LlmEndpoint(llm)
        self.settings = self.llm.settings
        self.tools = {t.name: t for t in tools}
        self.name = name
        self.system_prompt = system_prompt
        """This agent's own default prompt (None: `VA_LLM__SYSTEM_PROMPT`)."""

    @property
    def prepare_safe(self) -> bool:
        """A reply may be prepared before the turn is over unless a tool has side effects."""
        return not any(t.side_effects for t in self.tools.values())

    def messages(
        self, history: list[Turn], instructions: str | None = None
    ) -> list[dict[str, Any]]:
        """The chat messages for a conversation (agent turns hold what the user heard)."""
        system = instructions or self.system_prompt or self.settings.system_prompt
        settings = self.settings
        return chat_messages(
            history,
            system,
            settings.history_turns,
            settings.max_context_chars,
            settings.max_tool_output_chars,
        )

    async def respond(
        self,
        history: list[Turn],
        instructions: str | None = None,
        client_tools: ClientTools | None = None,
    ) -> AsyncIterator[AgentOutput]:
        messages = self.messages(history, instructions)
        theirs = {t.name for t in client_tools.tools} if client_tools else set()
        specs = [t.spec() for t in self.tools.values()]
        specs += [_client_spec(t) for t in client_tools.tools] if client_tools else []
        choice: ToolChoice = client_tools.choice if client_tools else "auto"
        named = getattr(choice, "name", None)
        if named is not None and named not in self.tools and named not in theirs:
            # the LLM server's 400 would say the same, after a request, in its own words
            raise InvalidMessage(
                f"tool_choice names the function {named!r}, which is not one of the "
                "session's tools nor the agent's"
            )
        settings = self.settings
        limits = ToolLimits(
            settings.tool_timeout_s,
            settings.max_tool_output_chars,
            self.llm.tool_pool,
            SESSION.get() or object(),  # the calls of this reply count together
        )
        rounds = settings.max_tool_rounds
        for round_ in range(rounds):
            step = _Step()
            last = round_ == rounds - 1
            async for delta in self._complete(messages, specs, "none" if last else choice, step):
                yield delta
            calls = step.calls()
            if not calls:
                return
            if last:
                _calls_past_the_last_round(calls, step.text, rounds)
                return
            ours = tuple(c for c in calls if c.name not in theirs)
            if ours:
                yield ToolsCalled(ours)
                outputs = await run_calls(self.tools, ours, limits)
                yield ToolsAnswered(ours, tuple(outputs))
                messages += tool_exchange(ours, outputs, step.text)
            client_calls = tuple(c for c in calls if c.name in theirs)
            if client_calls:
                yield ToolsCalled(client_calls, client=True)
                return
            choice = "auto"  # `required` or a named function holds for the first call only

    async def _complete(
        self,
        messages: list[dict[str, Any]],
        specs: list[dict[str, Any]],
        choice: ToolChoice,
        step: _Step,
    ) -> AsyncIterator[str]:
        """Text deltas of one streamed model call; its tool calls gather in `step`."""
        settings = self.settings
        request: dict[str, Any] = {
            "model": self.llm.model,
            "messages": messages,
            "stream": True,
            "temperature": settings.temperature,
            "max_tokens": settings.max_tokens,
        }
        if specs:
            request["tools"] = specs
            request["tool_choice"] = _choice(choice)
        stream = None
        outcome = "cancelled"
        try:
            # The deadline only spans the wait for the first token: it is lifted before
            # anything is yielded, so it never fires while the reader holds the task.
            async with asyncio.timeout(settings.first_token_timeout_s) as first_token:
                stream = await self._open(request, first_token)
                async for chunk in stream:
                    choices = getattr(chunk, "choices", None) or []
                    if not choices or choices[0].delta is None:
                        continue
                    delta = choices[0].delta
                    if delta.tool_calls:
                        first_token.reschedule(None)
                        step.add(delta.tool_calls)
                    if delta.content:
                        first_token.reschedule(None)
                        step.text += delta.content
                        yield delta.content
            outcome = "ok"
        except TimeoutError as exc:
            outcome = "failed"
            raise AgentFailed(
                f"the LLM sent no first token within {settings.first_token_timeout_s:g} s"
            ) from exc
        except openai.APIError as exc:
            outcome = "failed"
            raise _failure(exc) from exc
        except (json.JSONDecodeError, AttributeError, TypeError) as exc:
            outcome = "failed"
            raise AgentFailed(f"the LLM sent a malformed stream chunk ({exc})") from exc
        finally:
            if stream is not None:
                await stream.close()  # at once, also when the reply was cancelled
            metrics.LLM_REQUESTS.labels(outcome).inc()

    async def _open(self, request: dict[str, Any], deadline: asyncio.Timeout) -> Any:
        """The stream of one request, retried (`max_retries`) while the wait the server asks
        for (Retry-After) or the backoff ends before `deadline`; else its error at once."""
        loop = asyncio.get_running_loop()
        for attempt in range(self.settings.max_retries + 1):
            try:
                return await self.llm.single.chat.completions.create(**request)
            except openai.APIError as exc:
                wait = _retry_wait(exc, attempt)
                ends = deadline.when()
                if (
                    wait is None
                    or attempt == self.settings.max_retries
                    or (ends is not None and loop.time() + wait >= ends)
                ):
                    raise
                log.info("LLM request failed (%s): retrying in %.2f s", _reason(exc), wait)
                await asyncio.sleep(wait)
        raise AssertionError("unreachable: the last attempt returns or raises")


def _calls_past_the_last_round(calls: Sequence[ToolCall], text: str, rounds: int) -> None:
    """The model called tools in the reply's last round, where `tool_choice` was `none`
    (a server that ignores it): they are not run. Its words, if any, end the reply; a reply
    that would end without any fails."""
    names = ", ".join(sorted({c.name for c in calls}))
    log.warning("the LLM called %s in the last of %d tool rounds: not run", names, rounds)
    if not text.strip():
        raise AgentFailed(
            f"the LLM still called tools ({names}) after {rounds} rounds instead of answering"
        )


RETRY_STATUSES = frozenset({408, 409, 429})
"""Statuses worth a retry (and every 5xx), as the OpenAI SDK has them."""


def _retry_wait(exc: openai.APIError, attempt: int) -> float | None:
    """Seconds to wait before retrying after `exc`, or None when it is not worth a retry."""
    if isinstance(exc, openai.APIConnectionError):  # timeouts included
        return _backoff(attempt)
    if not isinstance(exc, openai.APIStatusError):
        return None
    headers = exc.response.headers
    told = headers.get("x-should-retry")
    if told == "false" or (
        told != "true" and exc.status_code not in RETRY_STATUSES and exc.status_code < 500
    ):
        return None
    after = retry_after_s(headers)
    return after if after is not None and after > 0 else _backoff(attempt)


def _backoff(attempt: int) -> float:
    """0.5 s, doubling to at most 8 s, less up to a quarter at random (the SDK's)."""
    return min(0.5 * 2.0**attempt, 8.0) * (1 - 0.25 * random.random())  # noqa: S311  # jitter


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """The wait a response asks for: `retry-after-ms`, else `retry-after` in seconds or as
    an HTTP date; None without one."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) / scale
        except ValueError:
            continue
        return seconds if math.isfinite(seconds) else math.inf
    when = headers.get("retry-after")
    try:
        parsed = email.utils.parsedate_tz(when) if when else None
        return float(email.utils.mktime_tz(parsed) - time.time()) if parsed else None
    except (TypeError, ValueError, OverflowError):
        return None


def _failure(exc: openai.APIError) -> AgentFailed:
    """The typed error of a failed request: a 429 is `LlmRateLimited`."""
    if isinstance(exc, openai.RateLimitError):
        after = retry_after_s(exc.response.headers)
        body = exc.body if isinstance(exc.body, dict) else {}
        said = str(body.get("message", exc.message))[:200]
        wait = f"; it asks to wait {round(after, 1):g} s" if after is not None and after > 0 else ""
        return LlmRateLimited(f"the LLM is rate limiting requests (429: {said}){wait}", after)
    return AgentFailed(_reason(exc))


def _reason(exc: openai.APIError) -> str:
    """What went wrong, for the client and the log (never the key, no URL's credentials)."""
    if isinstance(exc, openai.APITimeoutError):
        return "the LLM timed out"
    if isinstance(exc, openai.APIConnectionError):
        return f"the LLM is unreachable ({redact_urls(str(exc.__cause__ or exc))})"
    if isinstance(exc, openai.AuthenticationError):
        return "the LLM refused the API key (401): set VA_LLM__API_KEY"
    if isinstance(exc, openai.APIStatusError):
        body = exc.body if isinstance(exc.body, dict) else {}
        return f"the LLM answered {exc.status_code}: {str(body.get('message', exc.message))[:200]}"
    return f"the LLM failed: {str(exc.message)[:200]}"


def _choice(choice: ToolChoice) -> Any:
    if isinstance(choice, str):
        return choice
    return {"type": "function", "function": {"name": choice.name}}


def _client_spec(spec: ToolSpec) -> dict[str, Any]:
    function = {"name": spec.name, "description": spec.description, "parameters": spec.parameters}
    return {"type": "function", "function": function}
