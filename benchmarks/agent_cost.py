"""What the `openai` agent costs: the official client against the hand-parsed SSE it replaced,
and what a tool round trip adds, against benchmarks/llm_server.py (a server of known cost).

    python -m benchmarks.agent_cost --requests 40 --out benchmarks/results/agent_cost.json

1. Client overhead, no tools: time to the first text delta and to the end of the stream,
   for today's agent (`OpenAiAgent` on `AsyncOpenAI`) and the one it replaced (httpx and a
   hand-written SSE parser, loaded from git at `--baseline`), alternating request by
   request on the same server: at TTFT 0 with no wait between tokens (the client's own
   cost), and at TTFT 300 ms, 50 tokens/s (a local model's pace).
2. A tool round trip: time to the first word of the answer with a tool that takes
   `--tool-ms` against the same reply without one. The target: the difference is the
   tool's own time plus one model call (the call that asked for the tool, measured by the
   server from request to end of stream), nothing more.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from benchmarks.llm_server import LlmServer, Script, ToolRule, tokens
from services.common.stats import summary
from services.gateway.agent import ToolsAnswered, Turn
from services.gateway.llm import LlmEndpoint, LlmSettings, OpenAiAgent
from services.gateway.tools import tool
from services.loadtest.report import write
from tests.servers import ServerThread

REPLY = "Sure, the weather in Paris is fine today. Anything else I can help you with?"
QUESTION = [Turn("user", "How is the weather?")]


def _baseline(commit: str, module: str = "llm") -> Any:
    """services/gateway/<module>.py as it was at `commit` (the agent: httpx + hand-parsed
    SSE; the chunker: a regular expression)."""
    root = Path(__file__).resolve().parents[1]
    source = subprocess.run(
        ["git", "show", f"{commit}:services/gateway/{module}.py"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    name = f"{module}_baseline"
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[name] = loaded
    spec.loader.exec_module(loaded)
    return loaded


def text_pipeline(commit: str, replies: int) -> dict[str, Any]:
    """CPU per token of the reply's text path: the chunker (sentencex now, a regular
    expression before) and, now, the speech-friendly rewrite of each chunk; and where
    each cuts the first chunk (the same token: the space after a sentence end arrives
    with the next word)."""
    from services.gateway.chunking import Chunker
    from services.gateway.speech import spoken

    old = _baseline(commit, "chunking")
    pieces = tokens(REPLY)

    def run(make: Callable[[], Any], speak: bool) -> tuple[float, int | None]:
        start = time.perf_counter()
        first: int | None = None
        for _ in range(replies):
            chunker = make()
            for index, piece in enumerate(pieces):
                chunks = chunker.feed(piece)
                if chunks and first is None:
                    first = index
                for chunk in chunks if speak else ():
                    spoken(chunk, "en")
            for chunk in chunker.flush() if speak else ():
                spoken(chunk, "en")
        per_token_us = (time.perf_counter() - start) / (replies * len(pieces)) * 1e6
        return per_token_us, first

    now_us, now_first = run(lambda: Chunker(6), True)
    before_us, before_first = run(lambda: old.Chunker(6), False)
    return {
        "tokens_per_reply": len(pieces),
        "cpu_per_token_us": {"now": round(now_us, 1), "before": round(before_us, 1)},
        "first_chunk_cut_at_token": {"now": now_first, "before": before_first},
    }


async def _timed(stream: AsyncIterator[Any]) -> tuple[float, float, float | None]:
    """(first delta, end, first delta after a tool's results) in ms from the start."""
    start = time.perf_counter()
    first: float | None = None
    after_tool: float | None = None
    answered = False
    async for item in stream:
        now = (time.perf_counter() - start) * 1000
        if isinstance(item, ToolsAnswered):
            answered = True
        elif isinstance(item, str) and item:
            first = now if first is None else first
            if answered and after_tool is None:
                after_tool = now
    return first or 0.0, (time.perf_counter() - start) * 1000, after_tool


async def client_overhead(url: str, baseline: Any, requests: int, label: str) -> dict[str, Any]:
    import httpx

    endpoint = LlmEndpoint(LlmSettings(base_url=url, model="m"))
    ours = OpenAiAgent(endpoint)
    async with httpx.AsyncClient(timeout=30.0) as http:
        theirs = baseline.OpenAiAgent(baseline.LlmSettings(base_url=url, model="m"), http)
        agents: dict[str, Callable[[], AsyncIterator[Any]]] = {
            "openai_sdk": lambda: ours.respond(QUESTION),
            "httpx_sse_before": lambda: theirs.respond(QUESTION),
        }
        rows: dict[str, list[tuple[float, float]]] = {name: [] for name in agents}
        for make in agents.values():  # warm both connection pools
            await _timed(make())
        for _ in range(requests):
            for name, make in agents.items():
                first, end, _ = await _timed(make())
                rows[name].append((first, end))
    await endpoint.aclose()
    out: dict[str, Any] = {"condition": label}
    for name, values in rows.items():
        out[name] = {
            "first_delta_ms": summary([v[0] for v in values]),
            "stream_ms": summary([v[1] for v in values]),
        }
    return out


async def tool_round_trip(
    server: LlmServer, url: str, requests: int, tool_ms: float
) -> dict[str, Any]:
    @tool
    async def get_weather(city: str) -> str:
        """The weather in a city."""
        await asyncio.sleep(tool_ms / 1000)
        return "sunny"

    endpoint = LlmEndpoint(LlmSettings(base_url=url, model="m"))
    with_tool = OpenAiAgent(endpoint, tools=[get_weather])
    plain = OpenAiAgent(endpoint)
    asked = [Turn("user", "What is the weather in Paris?")]
    rows: list[dict[str, float]] = []
    await _timed(plain.respond(QUESTION))  # warm the pool
    for _ in range(requests):
        base_first, _, _ = await _timed(plain.respond(QUESTION))
        before = len(server.requests)
        _, _, answer_first = await _timed(with_tool.respond(asked))
        call = server.requests[before]  # the model call that asked for the tool
        assert call.finished is not None and answer_first is not None
        model_call = (call.finished - call.received) * 1000
        extra = answer_first - base_first
        rows.append(
            {
                "plain_first_delta_ms": base_first,
                "answer_first_delta_ms": answer_first,
                "added_ms": extra,
                "tool_ms": tool_ms,
                "asking_model_call_ms": model_call,
                "unexplained_ms": extra - tool_ms - model_call,
            }
        )
    await endpoint.aclose()
    return {key: summary([r[key] for r in rows]) for key in rows[0]}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    baseline = _baseline(args.baseline)
    rule = ToolRule("weather", "get_weather", {"city": "Paris"}, "Let me check.")
    server = LlmServer(Script(reply=REPLY, rules=(rule,), answer="It is {output} in Paris."))
    results: dict[str, Any] = {"text_pipeline": text_pipeline(args.baseline, 200)}
    with ServerThread(server.app) as thread:
        url = f"{thread.http}/v1"
        server.ttft_ms, server.tokens_per_s = 0, 0
        fast = await client_overhead(url, baseline, args.requests, "TTFT 0, no wait")
        server.ttft_ms, server.tokens_per_s = 300, 50
        paced = await client_overhead(url, baseline, args.requests, "TTFT 300 ms, 50 tokens/s")
        results["client_overhead"] = [fast, paced]
        results["tool_round_trip"] = await tool_round_trip(server, url, args.requests, args.tool_ms)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--tool-ms", type=float, default=200.0)
    parser.add_argument("--baseline", default="eb8f2c5", help="the commit of the old agent")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    started = time.time()
    results = asyncio.run(run(args))
    report = {
        "benchmark": "benchmarks/agent_cost.py",
        "command": " ".join(["python -m benchmarks.agent_cost", *sys.argv[1:]]),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_avg_at_start": os.getloadavg(),
        },
        "wall_s": round(time.time() - started, 1),
        **results,
    }
    if args.out:
        write(args.out, report)
    import json

    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
