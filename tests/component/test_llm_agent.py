"""The `openai` agent against a small OpenAI-compatible streaming server of our own."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from services.client.stream import StreamClient
from services.common.errors import AgentFailed
from services.gateway.agent import Turn
from services.gateway.app import create_app
from services.gateway.llm import LlmSettings, OpenAiAgent
from services.gateway.settings import GatewaySettings
from tests.conftest import Stack
from tests.servers import ServerThread

REPLY = ["Sure", ", the", " weather", " is fine.", " Anything", " else?"]


def fake_llm() -> FastAPI:
    app = FastAPI()
    app.state.requests = []

    def sse(deltas: list[str], delay: float) -> AsyncIterator[bytes]:
        async def stream() -> AsyncIterator[bytes]:
            for delta in deltas:
                await asyncio.sleep(delay)
                chunk = {"choices": [{"index": 0, "delta": {"content": delta}}]}
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return stream()

    @app.post("/{mode}/v1/chat/completions")
    async def chat(mode: str, request: Request) -> Response:
        body = await request.json()
        app.state.requests.append(body)
        if mode == "error":
            return JSONResponse({"error": {"message": "model overloaded"}}, 503)
        if mode == "hang":
            await asyncio.sleep(30)
        if mode == "garbage":
            return StreamingResponse(
                iter([b"data: {not json}\n\n"]), media_type="text/event-stream"
            )
        delay = 0.3 if mode == "slow" else 0.0
        return StreamingResponse(sse(REPLY, delay), media_type="text/event-stream")

    return app


@pytest.fixture(scope="module")
def llm_server() -> Iterator[ServerThread]:
    with ServerThread(fake_llm()) as server:
        yield server


def agent(server: ServerThread, mode: str, **overrides: object) -> LlmSettings:
    return LlmSettings(base_url=f"{server.http}/{mode}/v1", model="m", **overrides)  # type: ignore[arg-type]


async def collect(settings: LlmSettings, history: list[Turn]) -> list[str]:
    async with httpx.AsyncClient() as client:
        return [delta async for delta in OpenAiAgent(settings, client).respond(history)]


async def test_streams_deltas_and_sends_history(llm_server: ServerThread) -> None:
    history = [Turn("user", "hi"), Turn("agent", "hello"), Turn("user", "weather?")]
    assert await collect(agent(llm_server, "ok", api_key="k"), history) == REPLY
    sent = llm_server.server.config.app.state.requests[-1]
    assert sent["stream"] is True and sent["model"] == "m"
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "user"]
    assert sent["messages"][-1]["content"] == "weather?"
    assert sent["messages"][0]["content"] == LlmSettings().system_prompt  # the default


def test_session_instructions_replace_the_default_prompt() -> None:
    chat = OpenAiAgent(LlmSettings()).messages([Turn("user", "hi")], "Be terse.")
    assert chat == [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"}]


async def test_slow_but_steady_is_fine(llm_server: ServerThread) -> None:
    a = agent(llm_server, "slow", token_timeout_s=2.0)
    assert await collect(a, [Turn("user", "hi")]) == REPLY


@pytest.mark.parametrize(
    ("mode", "match"),
    [("error", "503"), ("hang", "timed out"), ("garbage", "malformed")],
)
async def test_failures_are_agent_failed(llm_server: ServerThread, mode: str, match: str) -> None:
    a = agent(llm_server, mode, first_token_timeout_s=0.5, token_timeout_s=0.5)
    with pytest.raises(AgentFailed, match=match):
        await collect(a, [Turn("user", "hi")])


async def test_unreachable_server_is_agent_failed() -> None:
    a = LlmSettings(base_url="http://127.0.0.1:9/v1", first_token_timeout_s=0.5)
    with pytest.raises(AgentFailed):
        await collect(a, [Turn("user", "hi")])


async def test_gateway_with_llm_agent(llm_server: ServerThread, lite_stack: Stack) -> None:
    """Through a gateway: the LLM's reply is spoken; a failing LLM costs an error only."""
    settings = GatewaySettings(redis=lite_stack.redis)
    settings.llm.base_url = f"{llm_server.http}/ok/v1"
    with ServerThread(create_app(settings)) as gateway:
        async with StreamClient(f"{gateway.ws}/v1/stream") as client:
            pirate = "You are a pirate. Answer in one sentence."
            await client.send(
                {"type": "session.update", "session": {"agent": "openai", "instructions": pirate}}
            )
            updated = await client.wait_for("session.updated")
            assert updated["session"]["instructions"] == pirate
            turn = client.new_turn()
            await client.send({"type": "conversation.text", "text": "how is the weather?"})
            done = await client.wait_for("response.done", 20)
            assert (
                done["status"] == "completed"
                and done["text"] == "Sure, the weather is fine. Anything else?"
            )
            assert len(turn.audio) > 0
            deltas = "".join(e["delta"] for e in turn.of_type("response.text.delta"))
            assert deltas == "".join(REPLY)
            sent = llm_server.server.config.app.state.requests[-1]["messages"]
            assert sent[0] == {"role": "system", "content": pirate}  # the session's own prompt

        settings.llm.base_url = f"{llm_server.http}/error/v1"
        async with StreamClient(f"{gateway.ws}/v1/stream") as client:
            await client.send({"type": "session.update", "session": {"agent": "openai"}})
            await client.wait_for("session.updated")
            turn = client.new_turn()
            await client.send({"type": "conversation.text", "text": "hello?"})
            error = await client.wait_for("error", 20)
            assert error["code"] == "agent_failed" and error["fatal"] is False
            done = await client.wait_for("response.done", 20)
            assert done["status"] == "failed"
            # the session goes on
            turn = client.new_turn()
            await client.send({"type": "response.create", "text": "Still here."})
            done = await client.wait_for("response.done", 20)
            assert done["status"] == "completed" and len(turn.audio) > 0
