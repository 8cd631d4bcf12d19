"""The fault drill's scenarios, each against a fresh stack of processes under spoken load
(benchmarks/fault_drill.py runs them and writes the results).

Each fault function gets the running stack and the load, does its damage, and returns
what it measured itself; `under_load` adds the load's score (turns completed / lost /
duplicated, closes by code, recovery).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import websockets
from websockets.exceptions import InvalidStatus

from benchmarks.fault_load import SpokenLoad, score, stop_load
from benchmarks.stack import ProcessStack
from services.client.stream import StreamClient
from services.common.audio.pcm import AudioF32
from services.common.auth.api_keys import KeyStore
from services.common.bus.connection import connect
from services.common.bus.settings import RedisSettings
from tests.processes import ServiceProcess

Fault = Callable[[ProcessStack, SpokenLoad], Awaitable[dict[str, Any]]]
STEADY_S = 120.0
RECOVERY_S = 90.0
RESTART_AFTER_S = 1.0
WS_PATHS = {
    "gateway": ("/v1/stream", "/v1/realtime"),
    "asr": ("/v1/stream/asr",),
    "tts": ("/v1/stream/tts",),
}


@dataclass
class Drill:
    """What every scenario shares: the engines, the number of talking sessions, speech."""

    profile: str
    sessions: int
    corpus: list[AudioF32]
    workdir: Path

    def stack(self, name: str, **env: str) -> ProcessStack:
        settings = {
            "VA_PROFILE": self.profile,
            "VA_GATEWAY__END_OF_TURN": "silence",
            # what the faults cost, not what a busy machine's latency makes admission refuse
            "VA_GATEWAY__ADMISSION__ENABLED": "false",
            **env,
        }
        folder = self.workdir / name
        folder.mkdir(parents=True, exist_ok=True)
        return ProcessStack(settings, workdir=folder)


def gateway_url(stack: ProcessStack, path: str = "/v1/stream") -> str:
    return f"{stack.services['gateway'].ws}{path}"


async def under_load(drill: Drill, stack: ProcessStack, fault: Fault | None) -> dict[str, Any]:
    """Load the stack until every session has completed a turn, run `fault`, then wait
    until every session has completed a turn begun after it (or give up)."""
    load = SpokenLoad(gateway_url(stack), drill.sessions, drill.corpus)
    runner = asyncio.create_task(load.run(), name="load")
    try:
        if not await load.until_each_completed_after(0.0, STEADY_S):
            raise RuntimeError(f"the load never reached a steady state: {score(load, None)}")
        fault_at = time.monotonic()
        measured = await fault(stack, load) if fault is not None else {}
        recovered = await load.until_each_completed_after(fault_at, RECOVERY_S)
        if fault is None:
            await asyncio.sleep(20.0)  # the baseline: a while of plain load
    finally:
        await stop_load(load, runner)
    return {**score(load, fault_at), **measured, "recovered": recovered}


# ---------------------------------------------------------------------------- the faults


async def kill_restart(service: ServiceProcess) -> float:
    """kill -9, start again 1 s later; how long the new process took to be ready."""
    service.send(signal.SIGKILL)
    await asyncio.to_thread(service.wait, 10)
    await asyncio.sleep(RESTART_AFTER_S)
    started = time.monotonic()
    await asyncio.to_thread(service.start)
    return round(time.monotonic() - started, 2)


def kill_and_restart(name: str) -> Fault:
    async def fault(stack: ProcessStack, _: SpokenLoad) -> dict[str, Any]:
        return {"ready_after_restart_s": await kill_restart(stack.services[name])}

    return fault


async def sigterm_gateway(stack: ProcessStack, _: SpokenLoad) -> dict[str, Any]:
    gateway = stack.services["gateway"]
    signalled = time.monotonic()
    gateway.send(signal.SIGTERM)
    status = await asyncio.to_thread(gateway.wait, 120)
    exited = time.monotonic() - signalled
    await asyncio.sleep(RESTART_AFTER_S)
    await asyncio.to_thread(gateway.start)
    return {"gateway_exit_after_s": round(exited, 2), "gateway_exit_status": status}


async def redis_frozen(stack: ProcessStack, _: SpokenLoad) -> dict[str, Any]:
    """SIGSTOP Redis for 10 s, asking every service's /health twice a second meanwhile."""
    health: Counter[str] = Counter()
    slowest: dict[str, float] = {}
    stack.signal_redis(signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 10.0
        async with httpx.AsyncClient(timeout=5.0) as http:
            while time.monotonic() < deadline:
                for name, url in stack.urls.items():
                    asked = time.monotonic()
                    try:
                        health[f"{name} {(await http.get(f'{url}/health')).status_code}"] += 1
                    except httpx.HTTPError as exc:
                        health[f"{name} {type(exc).__name__}"] += 1
                    took = round((time.monotonic() - asked) * 1000)
                    slowest[name] = max(slowest.get(name, 0), took)
                await asyncio.sleep(0.5)
    finally:
        stack.signal_redis(signal.SIGCONT)
    return {"health_while_frozen": dict(sorted(health.items())), "health_slowest_ms": slowest}


async def redis_restarted_empty(stack: ProcessStack, _: SpokenLoad) -> dict[str, Any]:
    stack.signal_redis(signal.SIGKILL)
    await asyncio.sleep(RESTART_AFTER_S)
    await asyncio.to_thread(stack.start_redis)
    return {}


async def capacity_plus_one(stack: ProcessStack, load: SpokenLoad) -> dict[str, Any]:
    """One session more than VA_GATEWAY__MAX_SESSIONS (the stack sets it to the load's)."""
    started = time.monotonic()
    events: list[str] = []
    async with websockets.connect(gateway_url(stack), open_timeout=10) as ws:
        try:
            async for message in ws:
                if isinstance(message, str):
                    events.append(json.loads(message).get("code") or json.loads(message)["type"])
        except websockets.ConnectionClosed:
            pass
        code = ws.close_code
    return {
        "extra_session_events": events,
        "extra_session_close_code": code,
        "extra_session_refused_in_ms": round((time.monotonic() - started) * 1000, 1),
    }


async def slow_reader(stack: ProcessStack, load: SpokenLoad) -> dict[str, Any]:
    """A client that asks for a long answer and then reads nothing for 20 s."""
    health = f"{stack.urls['gateway']}/health"
    async with httpx.AsyncClient(timeout=5.0) as http:

        async def rss() -> int:
            return int((await http.get(health)).json()["process"]["rss_bytes"])

        before = peak = await rss()
        async with websockets.connect(gateway_url(stack), max_queue=1, max_size=None) as ws:
            await ws.recv()  # session.created
            text = " ".join(["the ships sail on the sea and the wind blows"] * 8)  # ~30 s
            await ws.send(json.dumps({"type": "response.create", "text": text}))
            deadline = time.monotonic() + 20.0
            while time.monotonic() < deadline:
                peak = max(peak, await rss())
                await asyncio.sleep(1.0)
            await ws.close()
        after = await rss()
    mb = 1 / (1 << 20)
    return {
        "gateway_rss_before_mb": round(before * mb, 1),
        "gateway_rss_peak_while_not_read_mb": round(peak * mb, 1),
        "gateway_rss_after_mb": round(after * mb, 1),
    }


def junk_messages(count: int, seed: int) -> list[str | bytes]:
    """What an attacker or a broken client sends: noise as audio (odd lengths too), random
    text, JSON of unknown or malformed events, and now and then a frame over the cap."""
    rng = random.Random(seed)
    kinds: list[Callable[[], str | bytes]] = [
        lambda: rng.randbytes(rng.randint(1, 4000)),
        lambda: "".join(chr(rng.randint(32, 0x2FF)) for _ in range(rng.randint(1, 300))),
        lambda: json.dumps({"type": rng.choice(["x", "", "session.nope", "speak", "commit"])}),
        lambda: '{"type": "session.update", "session": {"input_sample_rate": 12345',
        lambda: json.dumps({"type": "session.update", "session": {"input_sample_rate": -1}}),
        lambda: json.dumps({"type": "speak", "id": 5, "text": ["no"]}),
        lambda: json.dumps({"type": "input_audio_buffer.append", "audio": "%%%not base64"}),
        lambda: json.dumps({"type": "conversation.item.create", "item": {"type": 7}}),
    ]
    messages = [rng.choice(kinds)() for _ in range(count)]
    for i in range(0, count, 250):
        messages[i] = bytes(2 * (1 << 20) + 1)  # over the 1 MiB frame cap: close 1009
    return messages


async def _junk_one(url: str, messages: list[str | bytes], closes: Counter[str]) -> int:
    """Send every message; after a frame over the cap, wait for the server to close the
    connection and go on on a new one. The error events the server answered."""
    errors, sent = 0, 0
    endpoint = "/" + url.split("/", 3)[-1]
    while sent < len(messages):
        async with websockets.connect(url, open_timeout=10, max_size=None) as ws:

            async def read(ws: Any = ws) -> None:
                nonlocal errors
                with contextlib.suppress(websockets.ConnectionClosed):
                    async for message in ws:
                        errors += isinstance(message, str) and '"error"' in message

            reader = asyncio.create_task(read())
            try:
                while sent < len(messages):
                    message = messages[sent]
                    sent += 1
                    await ws.send(message)
                    if len(message) > 1 << 20:
                        await asyncio.wait_for(reader, 10)  # the server closes: 1009
                        break
                else:
                    await asyncio.sleep(0.5)  # the answers to the last ones
            except websockets.ConnectionClosed:
                pass  # a close while sending: counted below
            await ws.close()
            await reader
            if ws.close_code not in (None, 1000):
                closes[f"{endpoint} {ws.close_code}"] += 1
    return errors


async def junk(stack: ProcessStack, _: SpokenLoad) -> dict[str, Any]:
    """1 000 junk messages on each WebSocket endpoint, then every service's /health."""
    closes: Counter[str] = Counter()
    errors: dict[str, int] = {}
    for service, paths in WS_PATHS.items():
        for path in paths:
            url = f"{stack.services[service].ws}{path}"
            errors[path] = await _junk_one(url, junk_messages(1000, len(errors)), closes)
    async with httpx.AsyncClient(timeout=5.0) as http:
        health = {n: (await http.get(f"{u}/health")).status_code for n, u in stack.urls.items()}
    alive = {name: service.running() for name, service in stack.services.items()}
    return {
        "junk_messages": 1000 * len(errors),
        "junk_error_events": errors,
        "junk_closes": dict(sorted(closes.items())),
        "health_after": health,
        "processes_alive_after": alive,
    }


# ------------------------------------------------------------------- tenant after a crash


async def tenant_resume_after_gateway_kill(drill: Drill, stack: ProcessStack) -> dict[str, Any]:
    """Auth on: tenant `acme` speaks a turn, the gateway is killed -9 and restarted; acme
    resumes its session (expected: resumed), a key of a tenant named `default` tries to
    (expected: 403)."""
    redis = connect(RedisSettings(url=stack.redis_url))
    try:
        store = KeyStore(redis, "va")
        acme, default = [(await store.create(t, "drill"))[1] for t in ("acme", "default")]
    finally:
        await redis.aclose()
    async with StreamClient(gateway_url(stack), api_key=acme) as client:
        session_id = client.session["id"]
        client.new_turn()
        await client.speak(drill.corpus[0], 16000)
        done = await client.silence_until("response.done", 30)
        await kill_restart(stack.services["gateway"])
    outcome = {
        "acme_turn": done.get("status"),
        "acme_resume": await _resume(stack, session_id, acme),
        "default_tenant_resume": await _resume(stack, session_id, default),
    }
    expected = {"acme_resume": "resumed", "default_tenant_resume": "refused 403"}
    outcome["passed"] = all(outcome[k] == v for k, v in expected.items())
    outcome["expected"] = expected
    return outcome


async def _resume(stack: ProcessStack, session_id: str, key: str) -> str:
    url = f"{gateway_url(stack)}?session_id={session_id}"
    try:
        async with StreamClient(url, api_key=key) as client:
            resumed = client.session.get("resumed") is True and client.session["id"] == session_id
            return "resumed" if resumed else "new session"
    except InvalidStatus as refused:
        return f"refused {refused.response.status_code}"


def env_auth_on() -> dict[str, str]:
    return {"VA_AUTH__REQUIRED": "true", "VA_AUTH__TOKEN_SECRET": os.urandom(24).hex()}
