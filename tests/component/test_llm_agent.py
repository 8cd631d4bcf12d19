"""The `openai` agent (the official client) against a real OpenAI-compatible server process:
benchmarks/llm_server.py, which streams as OpenAI does and records what it saw."""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from benchmarks.llm_server import LlmServer, Script
from services.client.stream import StreamClient
from services.common.errors import AgentFailed
from services.common.protocol.events import SessionConfig
from services.gateway.agent import Turn, closing
from services.gateway.app import AgentChoice, create_app
from services.gateway.llm import LlmEndpoint, LlmRateLimited, LlmSettings, OpenAiAgent
from services.gateway.reply import Reply, ReplyContext
from services.gateway.settings import GatewaySection, GatewaySettings
from tests.conftest import Stack
from tests.servers import ServerThread

REPLY = "Sure, the weather is fine. Anything else?"


@pytest.fixture(scope="module")
def llm() -> Iterator[tuple[LlmServer, ServerThread]]:
    server = LlmServer(Script(reply=REPLY), model="served-model")
    with ServerThread(server.app) as thread:
        yield server, thread


def settings(thread: ServerThread, mode: str = "ok", **overrides: object) -> LlmSettings:
    return LlmSettings(base_url=f"{thread.http}/{mode}/v1", model="m", **overrides)  # type: ignore[arg-type]


async def collect(llm: LlmSettings, history: list[Turn]) -> list[str]:
    endpoint = LlmEndpoint(llm)
    try:
        return [d async for d in OpenAiAgent(endpoint).respond(history) if isinstance(d, str)]
    finally:
        await endpoint.aclose()


async def test_streams_deltas_and_sends_history(llm: tuple[LlmServer, ServerThread]) -> None:
    server, thread = llm
    history = [Turn("user", "hi"), Turn("agent", "hello"), Turn("user", "weather?")]
    deltas = await collect(settings(thread, api_key="k"), history)
    assert "".join(deltas) == REPLY and len(deltas) == len(REPLY.split())  # token by token
    sent = server.requests[-1].body
    assert sent["stream"] is True and sent["model"] == "m" and "tools" not in sent
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "user"]
    assert sent["messages"][-1]["content"] == "weather?"
    assert sent["messages"][0]["content"] == LlmSettings().system_prompt  # the default


def test_session_instructions_replace_the_default_prompt() -> None:
    chat = OpenAiAgent(LlmSettings()).messages([Turn("user", "hi")], "Be terse.")
    assert chat == [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"}]


async def test_slow_but_steady_is_fine(llm: tuple[LlmServer, ServerThread]) -> None:
    server, thread = llm
    server.tokens_per_s = 20  # 50 ms between tokens, under the 1 s stall limit
    try:
        deltas = await collect(settings(thread, token_timeout_s=1.0), [Turn("user", "hi")])
    finally:
        server.tokens_per_s = 0
    assert "".join(deltas) == REPLY


@pytest.mark.parametrize(
    ("mode", "match"),
    [
        ("error", "answered 503: model overloaded"),
        ("hang", "no first token"),
        ("garbage", "malformed"),
    ],
)
async def test_failures_are_agent_failed(
    llm: tuple[LlmServer, ServerThread], mode: str, match: str
) -> None:
    _, thread = llm
    # a short deadline only where it is what is tested: an error or a bad chunk must not
    # be outrun by it on a loaded machine
    limit = 0.5 if mode == "hang" else 30.0
    bounded = settings(
        thread, mode, first_token_timeout_s=limit, token_timeout_s=limit, max_retries=0
    )
    with pytest.raises(AgentFailed, match=match):
        await collect(bounded, [Turn("user", "hi")])


async def test_unreachable_server_is_agent_failed() -> None:
    unreachable = LlmSettings(base_url="http://127.0.0.1:9/v1", first_token_timeout_s=2)
    with pytest.raises(AgentFailed, match=r"unreachable|timed out"):
        await collect(unreachable.model_copy(update={"max_retries": 0}), [Turn("user", "hi")])


async def test_a_cancelled_reply_closes_the_http_stream_at_once(
    llm: tuple[LlmServer, ServerThread],
) -> None:
    """Barge-in cancels the reply's task while the agent waits for the next token: the
    stream is closed then and there, and the server sees the client go."""
    server, thread = llm
    server.tokens_per_s = 1  # a token a second: the reply is far from done
    server.disconnected.clear()
    before = server.disconnects
    endpoint = LlmEndpoint(settings(thread))
    first = asyncio.Event()

    async def reply() -> None:
        async with closing(OpenAiAgent(endpoint).respond([Turn("user", "hi")])) as stream:
            async for _ in stream:
                first.set()

    try:
        task = asyncio.create_task(reply())
        await asyncio.wait_for(first.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await asyncio.to_thread(server.disconnected.wait, 10), "the server saw no disconnect"
    finally:
        server.tokens_per_s = 0
        await endpoint.aclose()
    assert server.disconnects == before + 1
    assert server.requests[-1].disconnected and server.requests[-1].finished is None


async def test_the_probe_finds_the_served_model(llm: tuple[LlmServer, ServerThread]) -> None:
    _, thread = llm
    endpoint = LlmEndpoint(LlmSettings(base_url=f"{thread.http}/v1"))
    assert endpoint.configured and endpoint.model == "default"
    assert await endpoint.probe() is None
    assert endpoint.model == "served-model"  # unset: the first model the server lists
    await endpoint.aclose()
    for mode, reason, limit in (("error", "503", 30.0), ("hang", "no answer within 0.3 s", 0.3)):
        bounded = LlmEndpoint(
            LlmSettings(base_url=f"{thread.http}/{mode}/v1", probe_timeout_s=limit)
        )
        assert reason in (await bounded.probe() or "")
        await bounded.aclose()


async def test_credentials_in_the_url_reach_neither_notices_nor_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`VA_LLM__BASE_URL=http://user:password@host/v1` (basic auth in front of llama.cpp):
    the server gets the credentials; `session.created`'s notice, `GET /v1/agents` and the
    log (the HTTP client's request lines included) show the URL without them."""
    server = LlmServer(Script(reply=REPLY))
    authorizations: list[str | None] = []

    async def record(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        authorizations.append(request.headers.get("authorization"))
        return await call_next(request)

    server.app.middleware("http")(record)
    caplog.set_level(logging.DEBUG)
    agents = {"echo": object(), "openai": object()}
    with ServerThread(server.app) as thread:
        url = f"http://svc:S3cret%40pw@127.0.0.1:{thread.port}/v1"
        endpoint = LlmEndpoint(LlmSettings(base_url=url, model="m", api_key="sk-key"))
        assert endpoint.url == f"http://127.0.0.1:{thread.port}/v1"
        choice = AgentChoice("echo")
        await choice.settle(None, endpoint, agents)
        assert choice.agent == "openai"
        deltas = [d async for d in OpenAiAgent(endpoint).respond([Turn("user", "hi")])]
        await endpoint.aclose()
    assert "".join(str(d) for d in deltas) == REPLY
    basic = "Basic " + base64.b64encode(b"svc:S3cret@pw").decode()
    assert authorizations == [basic, basic]  # the probe and the chat request

    down = LlmEndpoint(
        LlmSettings(base_url="http://svc:S3cret@127.0.0.1:9/v1?token=Q7", probe_timeout_s=1)
    )
    assert down.url == "http://127.0.0.1:9/v1"
    choice = AgentChoice("echo")
    await choice.settle(None, down, agents)
    await down.aclose()
    assert choice.agent == "echo" and "http://127.0.0.1:9/v1 did not answer" in (
        choice.notice or ""
    )
    assert "HTTP Request: POST" in caplog.text  # the HTTP client's lines were captured
    for secret in ("S3cret", "Q7"):
        assert secret not in (choice.notice or "") and secret not in caplog.text


def rate_limiting(retry_after: str) -> tuple[FastAPI, list[float]]:
    """A server that answers every chat request 429 with this Retry-After; when each came."""
    app = FastAPI()
    seen: list[float] = []

    @app.post("/v1/chat/completions")
    async def chat() -> JSONResponse:
        seen.append(time.monotonic())
        error = {"message": "Rate limit reached", "type": "requests", "code": "rate_limit"}
        return JSONResponse({"error": error}, 429, headers={"retry-after": retry_after})

    return app, seen


async def test_a_429_that_asks_for_longer_than_the_reply_can_wait_says_so_at_once() -> None:
    """Retry-After: 30 against a 10 s first-token deadline: no retry (the SDK would sleep
    the 30 s, and the client would hear `no first token within 10 s`); the error says
    what the server said, long before the deadline (a bound a loaded machine keeps)."""
    app, seen = rate_limiting("30")
    with ServerThread(app) as thread:
        bounded = LlmSettings(
            base_url=f"{thread.http}/v1", model="m", first_token_timeout_s=10, max_retries=1
        )
        started = time.monotonic()
        with pytest.raises(LlmRateLimited, match=r"rate limiting requests \(429: Rate limit"):
            await collect(bounded, [Turn("user", "hi")])
    assert time.monotonic() - started < 5 and len(seen) == 1


async def test_a_429_with_a_short_retry_after_is_retried_after_that_wait() -> None:
    app, seen = rate_limiting("0.3")
    with ServerThread(app) as thread:
        bounded = LlmSettings(
            base_url=f"{thread.http}/v1", model="m", first_token_timeout_s=3, max_retries=1
        )
        with pytest.raises(LlmRateLimited) as raised:
            await collect(bounded, [Turn("user", "hi")])
    assert len(seen) == 2 and seen[1] - seen[0] >= 0.3
    assert raised.value.code == "agent_failed" and raised.value.retry_after_s == 0.3


def test_openai_environment_is_honoured_when_va_settings_are_unset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://llm.example:8080/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.setenv("VA_LLM__MODEL", "qwen")
    read = GatewaySettings()
    assert read.llm.base_url == "http://llm.example:8080/v1" and read.llm.model == "qwen"
    assert read.llm.api_key is not None and read.llm.api_key.get_secret_value() == "sk-from-env"
    assert "sk-from-env" not in repr(read)  # a secret is never printed
    monkeypatch.setenv("VA_LLM__BASE_URL", "http://mine:9000/v1")
    assert GatewaySettings().llm.base_url == "http://mine:9000/v1"  # VA_ wins
    monkeypatch.delenv("OPENAI_BASE_URL")
    monkeypatch.delenv("OPENAI_API_KEY")
    monkeypatch.delenv("VA_LLM__BASE_URL")
    assert not LlmEndpoint(GatewaySettings().llm).configured


async def test_gateway_defaults_to_openai_when_the_llm_answers(
    llm: tuple[LlmServer, ServerThread], lite_stack: Stack
) -> None:
    """Through a gateway: an LLM that answers at start-up makes `openai` the default; its
    reply is spoken; a failing LLM costs an error only. Without one: `echo`, and why."""
    server, thread = llm
    gateway_settings = GatewaySettings(
        redis=lite_stack.redis, gateway=GatewaySection(end_of_turn="silence")
    )
    gateway_settings.llm.base_url = f"{thread.http}/ok/v1"
    with ServerThread(create_app(gateway_settings)) as gateway:
        async with StreamClient(f"{gateway.ws}/v1/stream") as client:
            assert client.session["agent"] == "openai" and client.notice is None
            pirate = "You are a pirate. Answer in one sentence."
            await client.send({"type": "session.update", "session": {"instructions": pirate}})
            await client.wait_for("session.updated")
            turn = client.new_turn()
            await client.send({"type": "conversation.text", "text": "how is the weather?"})
            done = await client.wait_for("response.done", 20)
            assert done["status"] == "completed" and done["text"] == REPLY
            assert len(turn.audio) > 0
            assert "".join(e["delta"] for e in turn.of_type("response.text.delta")) == REPLY
            sent = server.requests[-1].body["messages"]
            assert sent[0] == {"role": "system", "content": pirate}  # the session's own prompt
            assert server.requests[-1].body["model"] == "served-model"  # found by the probe

    gateway_settings.llm.base_url = f"{thread.http}/hang/v1"
    gateway_settings.llm.probe_timeout_s = 0.3
    gateway_settings.llm.first_token_timeout_s = 0.5
    with ServerThread(create_app(gateway_settings)) as gateway:
        async with StreamClient(f"{gateway.ws}/v1/stream") as client:
            assert client.session["agent"] == "echo"
            assert "did not answer (no answer within 0.3 s)" in (client.notice or "")
            await client.send({"type": "session.update", "session": {"agent": "openai"}})
            await client.wait_for("session.updated")
            await client.send({"type": "conversation.text", "text": "hello?"})
            error = await client.wait_for("error", 20)
            assert error["code"] == "agent_failed" and error["fatal"] is False
            done = await client.wait_for("response.done", 20)
            assert done["status"] == "failed"
            turn = client.new_turn()
            await client.send({"type": "response.create", "text": "Still here."})
            done = await client.wait_for("response.done", 20)
            assert done["status"] == "completed" and len(turn.audio) > 0  # the session goes on


class _Quiet:
    """A reply's output and bus that take everything and do nothing (a held reply sends
    nothing anyway)."""

    reply_to = "va:results:test"

    def __init__(self) -> None:
        self.tts: list[str] = []
        self.sent: list[object] = []

    async def send(self, event: object) -> None:
        self.sent.append(event)

    async def send_audio(self, data: bytes, coding: object = None) -> None: ...

    async def send_error(self, exc: object) -> None:
        self.sent.append(exc)

    async def submit_tts(self, job: Any) -> None:
        self.tts.append(job.text)

    async def cancel(self, response_id: str) -> None: ...


async def test_a_discarded_prepared_reply_closes_the_http_stream(
    llm: tuple[LlmServer, ServerThread],
) -> None:
    """The reply prepared during a pause (held), dropped when the user goes on: its LLM
    stream is closed then, not when the model finishes."""
    server, thread = llm
    server.tokens_per_s = 2
    server.disconnected.clear()
    endpoint = LlmEndpoint(settings(thread))
    quiet = _Quiet()
    tasks: set[asyncio.Task[None]] = set()

    def spawn(coro: Any, name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        tasks.add(task)
        return task

    async def finished(*_: object) -> None: ...

    context = ReplyContext(
        quiet,
        quiet,
        GatewaySection(first_chunk_words=1),
        "t",
        spawn,
        time.monotonic,
        finished,  # type: ignore[arg-type]
        finished,  # type: ignore[arg-type]
    )
    agent = OpenAiAgent(endpoint)
    reply = Reply(
        context, SessionConfig(id="s"), lambda: agent.respond([Turn("user", "hi")]), "openai"
    )
    try:
        await reply.start(held=True)
        async with asyncio.timeout(10):
            while not quiet.tts:  # the first words went to TTS: the stream is open
                await asyncio.sleep(0.01)
        await reply.discard()
        assert await asyncio.to_thread(server.disconnected.wait, 10), "the stream stayed open"
    finally:
        server.tokens_per_s = 0
        await endpoint.aclose()
    assert quiet.sent == []  # held, then discarded: the client saw nothing
    assert server.requests[-1].disconnected
