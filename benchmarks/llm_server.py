"""An OpenAI-compatible chat completions server of known cost: scripted replies and tool calls,
streamed as OpenAI streams them, at a set time to first token and token rate.

    python -m benchmarks.llm_server --ttft-ms 300 --tokens-per-s 50 --port 8080
    python -m benchmarks.llm_server --port 8080 --reply "You said: {user}." \\
        --tool-rule 'weather=get_weather:{"city": "Paris"}' --answer "It is {output}."

Then point the gateway at it: `VA_LLM__BASE_URL=http://127.0.0.1:8080/v1`.

What it answers (`Script`): to a conversation whose last message is a tool result, the
`answer` template (`{output}`: the results); else, when a `ToolRule`'s pattern matches the
last user message and the request offers that tool (and `tool_choice` is not `none`), a call
of it (after the rule's `preamble`, spoken first); else the `reply` template (`{user}`: the
last user message). A token is a word with its leading space; tool arguments stream in
pieces of `ARGUMENT_PIECE` characters, as OpenAI splits them.

Faults for tests, by path prefix: `/error/v1/...` answers 503, `/hang/v1/...` never
answers, `/garbage/v1/...` streams a chunk that is not JSON. Every request is recorded
(`LlmServer.requests`), and every stream the client closed before its end
(`LlmServer.disconnects`; `LlmServer.disconnected` is set on each).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

ARGUMENT_PIECE = 8
FAULTS = ("error", "hang", "garbage")


@dataclass(frozen=True)
class ToolRule:
    """Call `name` with `arguments` when `pattern` (a regex, any case) is in the user's words."""

    pattern: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    preamble: str = ""
    """Said before the call (the gateway speaks it while the tool runs)."""

    @classmethod
    def parse(cls, text: str) -> ToolRule:
        """`PATTERN=NAME[:JSON ARGUMENTS]`, as `--tool-rule` takes it."""
        pattern, _, call = text.partition("=")
        name, _, arguments = call.partition(":")
        if not pattern or not name:
            raise ValueError(f"tool rule {text!r}: write PATTERN=NAME[:JSON]")
        return cls(pattern, name, json.loads(arguments) if arguments else {})


@dataclass(frozen=True)
class Script:
    reply: str = "{user}"
    rules: tuple[ToolRule, ...] = ()
    answer: str = "{output}"

    def plan(self, body: dict[str, Any]) -> tuple[str, ToolRule | None]:
        """(text to stream, tool call to make after it) for one request."""
        messages = body.get("messages") or []
        last = messages[-1] if messages else {}
        if last.get("role") == "tool":
            outputs = []
            for message in reversed(messages):
                if message.get("role") != "tool":
                    break
                outputs.insert(0, str(message.get("content", "")))
            return self.answer.format(output="; ".join(outputs)), None
        user = next((m for m in reversed(messages) if m.get("role") == "user"), {})
        said = str(user.get("content", ""))
        offered = {t.get("function", {}).get("name") for t in body.get("tools") or []}
        if body.get("tool_choice") != "none":
            for rule in self.rules:
                if rule.name in offered and re.search(rule.pattern, said, re.IGNORECASE):
                    return rule.preamble, rule
        return self.reply.format(user=said), None


@dataclass
class Exchange:
    """One request: its body, and when its stream started, sent its first token, ended."""

    body: dict[str, Any]
    path: str
    received: float
    first_token: float | None = None
    finished: float | None = None
    disconnected: bool = False


class LlmServer:
    """The app and what it saw. `ttft_ms`: wait before the first chunk; `tokens_per_s`: rate
    of the tokens after it (0: as fast as it can)."""

    def __init__(
        self,
        script: Script | None = None,
        ttft_ms: float = 0.0,
        tokens_per_s: float = 0.0,
        model: str = "scripted",
    ) -> None:
        self.script = script or Script()
        self.ttft_ms = ttft_ms
        self.tokens_per_s = tokens_per_s
        self.model = model
        self.requests: list[Exchange] = []
        self.disconnects = 0
        self.disconnected = threading.Event()
        self.app = self._build()

    def _build(self) -> FastAPI:
        app = FastAPI(title="scripted OpenAI-compatible LLM")

        @app.get("/v1/models")
        @app.get("/{fault}/v1/models")
        async def models(request: Request, fault: str | None = None) -> Response:
            if fault == "error":
                return JSONResponse({"error": {"message": "model overloaded"}}, 503)
            if fault == "hang":
                await _hang(request)
            model = {"id": self.model, "object": "model", "created": 0, "owned_by": "benchmarks"}
            return JSONResponse({"object": "list", "data": [model]})

        @app.post("/v1/chat/completions")
        @app.post("/{fault}/v1/chat/completions")
        async def chat(request: Request, fault: str | None = None) -> Response:
            body = await request.json()
            exchange = Exchange(body, request.url.path, time.perf_counter())
            self.requests.append(exchange)
            if fault == "error":
                error = {"message": "model overloaded", "type": "server_error", "code": None}
                return JSONResponse({"error": error}, 503)
            if fault == "hang":
                await _hang(request)
            if fault == "garbage":
                garbage = iter([b"data: {not json}\n\n"])
                return StreamingResponse(garbage, media_type="text/event-stream")
            if not body.get("stream"):
                return JSONResponse(self._whole(body))
            return StreamingResponse(self._stream(body, exchange), media_type="text/event-stream")

        return app

    # ------------------------------------------------------------------ answers

    def _chunk(self, cid: str, delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        chunk = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.model,
            "system_fingerprint": "fp_scripted",
            "choices": [choice],
        }
        return f"data: {json.dumps(chunk)}\n\n".encode()

    async def _stream(self, body: dict[str, Any], exchange: Exchange) -> AsyncIterator[bytes]:
        text, rule = self.script.plan(body)
        cid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        gap = 1 / self.tokens_per_s if self.tokens_per_s > 0 else 0.0
        try:
            await asyncio.sleep(self.ttft_ms / 1000)
            exchange.first_token = time.perf_counter()
            yield self._chunk(cid, {"role": "assistant", "content": "", "refusal": None})
            for token in tokens(text):
                yield self._chunk(cid, {"content": token})
                await asyncio.sleep(gap)
            if rule is not None:
                for piece in _call_pieces(rule):
                    yield self._chunk(cid, {"tool_calls": [piece]})
                    await asyncio.sleep(gap)
            yield self._chunk(cid, {}, "tool_calls" if rule is not None else "stop")
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
                yield f"data: {json.dumps({'id': cid, 'choices': [], 'usage': usage})}\n\n".encode()
            yield b"data: [DONE]\n\n"
            exchange.finished = time.perf_counter()
        finally:
            if exchange.finished is None:  # the client closed the stream first
                exchange.disconnected = True
                self.disconnects += 1
                self.disconnected.set()

    def _whole(self, body: dict[str, Any]) -> dict[str, Any]:
        text, rule = self.script.plan(body)
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if rule is not None:
            message["tool_calls"] = [
                {
                    "id": f"call_{uuid.uuid4().hex[:12]}",
                    "type": "function",
                    "function": {"name": rule.name, "arguments": json.dumps(rule.arguments)},
                }
            ]
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [
                {"index": 0, "message": message, "finish_reason": "tool_calls" if rule else "stop"}
            ],
        }


async def _hang(request: Request) -> None:
    """Answer nothing until the client gives up (or an hour passes)."""
    for _ in range(36_000):
        if await request.is_disconnected():
            return
        await asyncio.sleep(0.1)


def tokens(text: str) -> list[str]:
    """A word with its leading space per token."""
    return re.findall(r"\s*\S+", text)


def _call_pieces(rule: ToolRule) -> Iterator[dict[str, Any]]:
    """A tool call as OpenAI streams it: id, type and name first, then the arguments in pieces."""
    arguments = json.dumps(rule.arguments)
    function = {"name": rule.name, "arguments": ""}
    call_id = f"call_{uuid.uuid4().hex[:12]}"
    yield {"index": 0, "id": call_id, "type": "function", "function": function}
    for start in range(0, len(arguments), ARGUMENT_PIECE):
        yield {"index": 0, "function": {"arguments": arguments[start : start + ARGUMENT_PIECE]}}


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--ttft-ms", type=float, default=0.0, help="time to first token")
    parser.add_argument("--tokens-per-s", type=float, default=0.0, help="0: no wait")
    parser.add_argument("--model", default="scripted", help="the name /v1/models lists")
    parser.add_argument("--reply", default="{user}", help="template; {user}: the user's words")
    parser.add_argument("--answer", default="{output}", help="after a tool result; {output}")
    parser.add_argument(
        "--tool-rule", action="append", default=[], help="PATTERN=NAME[:JSON], e.g. time=now:{}"
    )
    args = parser.parse_args(argv)
    script = Script(args.reply, tuple(ToolRule.parse(r) for r in args.tool_rule), args.answer)
    server = LlmServer(script, args.ttft_ms, args.tokens_per_s, args.model)
    print(f"OpenAI-compatible LLM at http://{args.host}:{args.port}/v1", flush=True)
    uvicorn.run(server.app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
