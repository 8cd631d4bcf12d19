"""The shipped nginx config, for real: TLS, two gateways behind least_conn, limits, routes.

A real nginx (not a daemon: a child process with its own prefix, pid and logs) serves
deploy/nginx/voice-agent.conf rendered for free ports and a certificate made here, in
front of two gateway processes (uvicorn threads) and the lite stack's ASR and TTS.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from websockets.exceptions import InvalidStatus

from services.client.stream import StreamClient
from services.common.audio.pcm import encode_audio
from services.gateway.app import create_app as gateway_app
from services.gateway.settings import GatewaySection, GatewaySettings
from services.ops.deploy import (
    NginxSite,
    nginx_binary,
    nginx_command,
    prepare_dirs,
    render_nginx,
)
from services.ops.redis_server import free_port
from tests.conftest import Stack
from tests.servers import ServerThread
from tests.speech import speak
from tests.tls import self_signed

PER_IP = 3
PER_SERVER = 5
SECRET = "s3cret-in-the-query"


@dataclass
class Front:
    """nginx in front of two gateways: where to reach it and what is behind it."""

    https_port: int
    http_port: int
    tls: ssl.SSLContext
    gateways: dict[str, Any]
    workdir: Path
    site: NginxSite
    upgrades: int = 0
    """WebSockets opened through nginx so far (each logs one 101 line when it ends)."""

    @property
    def https(self) -> str:
        return f"https://127.0.0.1:{self.https_port}"

    @property
    def wss(self) -> str:
        return f"wss://127.0.0.1:{self.https_port}"

    def sessions(self) -> dict[str, int]:
        return {gid: len(app.state.sessions) for gid, app in self.gateways.items()}

    def log(self, name: str) -> str:
        path = self.site.log_dir / name
        return path.read_text() if path.exists() else ""


def wait_until_serving(front: Front, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"nginx exited: {(front.workdir / 'nginx.out').read_text()}")
        try:
            if httpx.get(f"{front.https}/ready", verify=front.tls, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError("nginx did not serve /ready in 20 s")


@pytest.fixture(scope="module")
def front(lite_stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    if nginx_binary() is None:
        pytest.skip("nginx is not installed and could not be (scripts/system_deps.sh)")
    workdir = tmp_path_factory.mktemp("nginx")
    cert, key = self_signed(workdir)
    apps = {
        gid: gateway_app(
            GatewaySettings(redis=lite_stack.redis, gateway=GatewaySection(gateway_id=gid))
        )
        for gid in ("gw-a", "gw-b")
    }
    with ServerThread(apps["gw-a"]) as gw_a, ServerThread(apps["gw-b"]) as gw_b:
        site = NginxSite(
            gateways=(f"127.0.0.1:{gw_a.port}", f"127.0.0.1:{gw_b.port}"),
            asr=(f"127.0.0.1:{lite_stack.asr.port}",),
            tts=(f"127.0.0.1:{lite_stack.tts.port}",),
            bind=("127.0.0.1",),
            https_port=free_port(),
            http_port=free_port(),
            tls_cert=cert,
            tls_key=key,
            conn_per_ip=PER_IP,
            conn_per_server=PER_SERVER,
            worker_processes="2",
        ).sandboxed(workdir)
        prepare_dirs(site)
        conf = workdir / "nginx.conf"
        conf.write_text(render_nginx(site))
        tls = ssl.create_default_context(cafile=str(cert))
        front = Front(site.https_port, site.http_port, tls, apps, workdir, site)
        with (workdir / "nginx.out").open("wb") as out:
            proc = subprocess.Popen(
                nginx_command(conf, workdir, "-g", "daemon off;"), stdout=out, stderr=out
            )
        try:
            wait_until_serving(front, proc)
            yield front
        finally:
            proc.terminate()
            proc.wait(timeout=15)


@asynccontextmanager
async def sessions_open(front: Front, count: int, **connect: Any) -> AsyncIterator[list[Any]]:
    """`count` raw /v1/stream WebSockets through nginx, each past session.created."""
    async with AsyncExitStack() as stack:
        sockets = []
        for _ in range(count):
            ws = await stack.enter_async_context(
                websockets.connect(f"{front.wss}/v1/stream", ssl=front.tls, **connect)
            )
            front.upgrades += 1
            assert '"session.created"' in str(await ws.recv())
            sockets.append(ws)
        yield sockets


async def refused_status(front: Front, **connect: Any) -> int:
    with pytest.raises(InvalidStatus) as refused:
        async with websockets.connect(
            f"{front.wss}/v1/stream?session_id={SECRET}", ssl=front.tls, **connect
        ):
            pass
    return refused.value.response.status_code


async def all_closed(front: Front) -> None:
    """Wait until no session is open and nginx has finished every WebSocket: it logs one
    when it ends, just before it gives back the connection counts (limits, least_conn)."""
    async with asyncio.timeout(10):
        while any(front.sessions().values()) or (
            front.log("voice-agent.access.log").count('" 101 ') < front.upgrades
        ):
            await asyncio.sleep(0.05)
    await asyncio.sleep(0.05)


async def test_spoken_turn_over_wss(front: Front) -> None:
    front.upgrades += 1
    async with StreamClient(f"{front.wss}/v1/stream", ssl=front.tls) as client:
        assert sum(front.sessions().values()) == 1
        turn = client.new_turn()
        await client.speak(speak("tell me a story about the sea", 16000), 16000)
        done = await client.silence_until("response.done", timeout_s=20)
    assert done["status"] == "completed"
    assert len(turn.of_type("transcript.final")) == 1
    assert done["text"] == turn.of_type("transcript.final")[0]["text"]
    assert len(turn.audio) > 24000  # over half a second of agent audio came through nginx
    await all_closed(front)


async def test_sessions_spread_over_both_gateways_and_limits_refuse(front: Front) -> None:
    await all_closed(front)
    async with sessions_open(front, PER_IP):
        counts = front.sessions()
        assert sum(counts.values()) == PER_IP
        assert all(n >= 1 for n in counts.values()), counts  # least_conn used both
        assert await refused_status(front) == 429  # per IP
        other_ip = {"local_addr": ("127.0.0.2", 0)}
        async with sessions_open(front, PER_SERVER - PER_IP, **other_ip):
            assert await refused_status(front, **other_ip) == 429  # per server
            assert sum(front.sessions().values()) == PER_SERVER
    await all_closed(front)
    async with sessions_open(front, PER_IP):  # the counts were given back
        pass
    await all_closed(front)


async def test_realtime_over_wss(front: Front) -> None:
    """/v1/realtime goes through the TLS front to the gateways, as /v1/stream does."""
    url = f"{front.wss}/v1/realtime?model=voice-agent"
    async with websockets.connect(url, ssl=front.tls) as ws:
        created = json.loads(await ws.recv())
        assert created["type"] == "session.created", created
        assert created["session"]["audio"]["input"]["format"]["rate"] == 24000
    await all_closed(front)


async def twilio_call(ws: Any, n: int) -> None:
    """Twilio's side of a call's opening: `connected`, then `start` (stream `n`)."""
    sid = f"MZ{n:032d}"
    start = {
        "accountSid": "AC" + "0" * 32,
        "streamSid": sid,
        "callSid": "CA" + "1" * 32,
        "tracks": ["inbound"],
        "customParameters": {},
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
    }
    await ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
    await ws.send(json.dumps({"event": "start", "start": start, "streamSid": sid}))


async def test_twilio_calls_from_one_address_pass_the_per_address_limit(front: Front) -> None:
    """/v1/twilio reaches the gateways; Twilio's calls come from few addresses, so only the
    per-server limit counts them: PER_SERVER calls from one address (more than PER_IP) are
    all answered, the next is refused."""
    await all_closed(front)
    async with AsyncExitStack() as stack:
        for n in range(PER_SERVER):
            ws = await stack.enter_async_context(
                websockets.connect(f"{front.wss}/v1/twilio", ssl=front.tls)
            )
            front.upgrades += 1
            await twilio_call(ws, n)
        async with asyncio.timeout(10):
            while sum(front.sessions().values()) < PER_SERVER:
                await asyncio.sleep(0.05)
        with pytest.raises(InvalidStatus) as refused:
            async with websockets.connect(f"{front.wss}/v1/twilio", ssl=front.tls):
                pass
        assert refused.value.response.status_code == 429  # per server
    await all_closed(front)
    access = front.log("voice-agent.access.log")
    assert access.count('"GET /v1/twilio HTTP/1.1" 101 ') == PER_SERVER


async def test_no_permessage_deflate_through_nginx(front: Front) -> None:
    front.upgrades += 1
    async with websockets.connect(
        f"{front.wss}/v1/stream", ssl=front.tls, compression="deflate"
    ) as ws:
        assert ws.response is not None
        assert "Sec-WebSocket-Extensions" not in ws.response.headers
        assert '"session.created"' in str(await ws.recv())
    await all_closed(front)


def test_rest_and_health_routes(front: Front) -> None:
    with httpx.Client(base_url=front.https, verify=front.tls, timeout=30) as http:
        gateway = http.get("/health").json()
        assert gateway["service"] == "gateway" and gateway["gateway_id"] in front.gateways
        assert gateway["gpu"]["available"] is False
        assert http.get("/health/asr").json()["service"] == "asr"
        assert http.get("/health/tts").json()["service"] == "tts"
        for path in ("/ready", "/ready/asr", "/ready/tts"):
            assert http.get(path).status_code == 200, path
        assert http.get("/metrics").status_code == 404  # scraped per process, not public
        assert "default" in str(http.get("/v1/voices").json())
        page = http.get("/")  # the browser client, from the gateways, over TLS
        assert page.status_code == 200 and "/static/app.js" in page.text
        assert http.get("/static/worklet.js").status_code == 200
        agents = http.get("/v1/agents")  # the page's agent list (was nginx's catch-all 404)
        assert agents.status_code == 200 and agents.json()["default"], agents.text

        speech = http.post(
            "/v1/audio/speech",
            json={"model": "tts-1", "input": "the sea is calm", "voice": "default"},
        )
        assert speech.status_code == 200 and len(speech.content) > 1000
        wav = encode_audio(speak("what is the weather like in paris today", 16000), 16000, "wav")
        text = http.post(
            "/v1/audio/transcriptions",
            files={"file": ("q.wav", wav, "audio/wav")},
            data={"model": "whisper-1"},
        ).json()["text"]
        assert "weather" in text or "paris" in text, text
        assert http.get(f"/health?token={SECRET}").status_code == 200

    plain = httpx.get(f"http://127.0.0.1:{front.http_port}/health?x=1", timeout=5)
    assert plain.status_code == 301
    assert plain.headers["location"] == f"https://127.0.0.1:{front.https_port}/health?x=1"


async def test_logs_carry_no_query_strings(front: Front) -> None:
    await all_closed(front)
    front.upgrades += 1
    async with websockets.connect(f"{front.wss}/v1/stream?session_id={SECRET}", ssl=front.tls):
        pass
    async with sessions_open(front, PER_IP):
        assert await refused_status(front) == 429
    await all_closed(front)
    async with httpx.AsyncClient(verify=front.tls) as http:
        assert (await http.get(f"{front.https}/health?token={SECRET}")).status_code == 200

    access = front.log("voice-agent.access.log")
    assert '"GET /v1/stream HTTP/1.1" 101 ' in access
    assert '"GET /v1/stream HTTP/1.1" 429 ' in access
    assert '"GET /health HTTP/1.1" 200 ' in access
    assert SECRET not in access and "token=" not in access and "session_id" not in access
    assert SECRET not in front.log("voice-agent.error.log")
