"""The gateway's `/v1/stream` and `/v1/realtime` in front of the duplex service (issue 29):
real servers on free ports, the duplex service's `fake` engine (an echo one 80 ms frame
late at half the level, and a text piece `" w<n>"` every 5th frame), a real Redis."""

from __future__ import annotations

import asyncio
import base64
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import soxr
from redis.asyncio import Redis

from services.common.audio.pcm import float_to_pcm16, pcm16_to_float
from services.common.audio.polyphase import PolyphaseResampler
from services.common.bus.keys import Keys
from services.common.bus.settings import RedisSettings
from services.gateway.app import create_app as gateway_app
from services.gateway.duplex_link import DuplexLink
from services.gateway.settings import GatewaySection, GatewaySettings
from tests.conftest import RedisProc
from tests.duplex_gateway import DuplexStack, duplex_stack, lag_and_gain, session, stream
from tests.servers import ServerThread
from tests.speech import speak

FRAME_24K = 1920  # one model frame (80 ms) at 24 kHz


@pytest.fixture(scope="module")
def stack(redis_server: RedisProc) -> Iterator[DuplexStack]:
    with duplex_stack(redis_server.settings(), max_sessions=4) as started:
        yield started


def _speech(rate: int) -> bytes:
    """1-2 s of speech then 1.5 s of silence (the VAD hears a start and a stop)."""
    audio = np.concatenate([speak("hello there, how are you today", rate), np.zeros(rate * 3 // 2)])
    return float_to_pcm16(audio.astype(np.float32))


def _refused(stack: DuplexStack) -> float:
    """The gateway's sessions refused because the duplex service had no slot."""
    text = httpx.get(f"{stack.gateway.http}/metrics", timeout=10).text
    line = 'va_gateway_sessions_refused_total{reason="duplex_capacity"} '
    found = [float(row.removeprefix(line)) for row in text.splitlines() if row.startswith(line)]
    return found[0] if found else 0.0


def _duplex_sessions(stack: DuplexStack) -> int:
    return int(httpx.get(f"{stack.duplex.http}/health", timeout=10).json()["sessions"])


async def test_stream_hears_the_echo_its_text_and_its_own_vad(stack: DuplexStack) -> None:
    async with session(stack.stream_url) as client:
        created = await client.event("session.created")
        assert created["session"]["input_sample_rate"] == 16000  # as on the cascade
        response = await client.event("response.created")
        # the page's first message: new rates, before any audio (the model's state is kept)
        await client.send(
            {
                "type": "session.update",
                "session": {"input_sample_rate": 24000, "output_sample_rate": 16000},
            }
        )
        await client.event("session.updated")
        pcm = _speech(24000)
        frames = len(pcm) // 2 // FRAME_24K
        await stream(client.ws, pcm, 24000)
        # every whole model frame comes back at once (at 16 kHz: 1280 samples each): the
        # gateway's resampler holds nothing back
        await client.until(lambda: client.samples().size >= frames * 1280 - 1)
        await client.send({"type": "session.close"})
        done = await client.event("response.done")
        await client.closed()

    assert client.ws.close_code == 1000
    kinds = [e["type"] for e in client.events]
    assert kinds[:3] == ["session.created", "response.created", "session.updated"]
    assert "output_audio.clear" not in kinds  # barge-in is the model's own
    started, stopped = client.of("speech.started"), client.of("speech.stopped")
    assert len(started) == 1 and len(stopped) == 1
    assert started[0]["utterance_id"] == stopped[0]["utterance_id"]
    assert 0 <= started[0]["audio_start_ms"] < stopped[0]["audio_end_ms"] <= 4000

    deltas = [e["delta"] for e in client.of("response.text.delta")]
    assert deltas[:3] == [" w5", " w10", " w15"]
    assert all(
        e["response_id"] == response["response_id"] for e in client.of("response.text.delta")
    )
    assert done["status"] == "completed"
    assert done["text"] == "".join(deltas).strip()
    audio_done = client.of("response.audio.done")[0]
    assert audio_done["audio_ms"] == pytest.approx(frames * 80, abs=80)

    # the echo: what was sent, at 16 kHz, half as loud, one model frame (80 ms) late
    sent = soxr.resample(pcm16_to_float(pcm), 24000, 16000)
    heard = pcm16_to_float(bytes(client.audio))
    lag, gain, correlation = lag_and_gain(sent, heard, 1280 + 400)
    filter_delay = PolyphaseResampler(24000, 16000).delay_ms * 16  # in samples at 16 kHz
    assert lag == pytest.approx(1280 + filter_delay, abs=2)  # 80 ms and the filter's 2 ms
    assert gain == pytest.approx(0.5, abs=0.03)
    assert correlation > 0.99
    assert np.abs(heard[:1200]).max() < 0.01  # the first frame is the echo of nothing


async def test_realtime_with_the_openai_sdk(stack: DuplexStack) -> None:
    client = openai.AsyncOpenAI(
        api_key="sk-local",
        base_url=f"{stack.gateway.http}/v1",
        websocket_base_url=f"{stack.gateway.ws}/v1",
        max_retries=0,
    )
    pcm = _speech(24000)
    frames = len(pcm) // 2 // FRAME_24K
    seen: list[dict[str, Any]] = []

    async def until(kind: str, **match: Any) -> dict[str, Any]:
        async with asyncio.timeout(30):
            while True:
                event = (await connection.recv()).to_dict()
                seen.append(event)
                if event["type"] == kind and all(event.get(k) == v for k, v in match.items()):
                    return event

    def audio() -> bytes:
        deltas = [e["delta"] for e in seen if e["type"] == "response.output_audio.delta"]
        return b"".join(base64.b64decode(d) for d in deltas)

    async with client, client.realtime.connect(model="voice-agent") as connection:
        await until("session.created")
        await until("response.created")
        await connection.response.create()  # the model answers by itself: refused
        refused = await until("error")
        for start in range(0, len(pcm), 4800):  # 100 ms appends, as the SDK's examples do
            chunk = base64.b64encode(pcm[start : start + 4800]).decode()
            await connection.input_audio_buffer.append(audio=chunk)
        await until("input_audio_buffer.speech_started")
        await until("input_audio_buffer.speech_stopped")
        async with asyncio.timeout(30):
            while len(audio()) < 2 * (frames - 1) * FRAME_24K:
                seen.append((await connection.recv()).to_dict())

    assert refused["error"]["code"] == "not_supported"
    assert "duplex" in refused["error"]["message"]
    transcript = [e["delta"] for e in seen if e["type"] == "response.output_audio_transcript.delta"]
    assert transcript[:2] == [" w5", " w10"]
    heard = np.frombuffer(audio(), "<i2").astype(np.int32)
    sent = np.frombuffer(pcm, "<i2").astype(np.int32)
    n = heard.size - FRAME_24K
    # no resampling on this path: the echo is exact (half of each sample, rounded)
    assert np.abs(heard[FRAME_24K:] - np.rint(sent[:n] * 0.5)).max() <= 1
    assert not np.any(heard[:FRAME_24K])


async def test_requests_the_model_does_not_take_cost_an_error_not_the_session(
    stack: DuplexStack,
) -> None:
    async with session(stack.stream_url) as client:
        await client.event("response.created")
        for message in (
            {"type": "response.create", "text": "Say this."},
            {"type": "conversation.text", "text": "Hello."},
            {"type": "response.cancel"},
            {"type": "dance"},
        ):
            await client.send(message)
        await client.until(lambda: len(client.of("error")) == 4)
        await stream(client.ws, float_to_pcm16(np.zeros(FRAME_24K * 4, np.float32) + 0.1), 24000)
        await client.until(lambda: client.samples().size > 0)
    codes = [(e["code"], e["fatal"]) for e in client.of("error")]
    assert codes == [("not_supported", False)] * 3 + [("invalid_message", False)]


async def test_a_full_duplex_service_is_the_clients_1013(redis_server: RedisProc) -> None:
    with duplex_stack(redis_server.settings(), max_sessions=1, retry_after_s=7) as stack:
        before = _refused(stack)  # the counter is the test process's: other gateways' too
        async with session(stack.stream_url) as first:
            await first.event("response.created")
            async with session(stack.stream_url) as second:
                await second.closed()
            assert second.ws.close_code == 1013
            assert "retry after 7 s" in (second.ws.close_reason or "")
            assert [e["type"] for e in second.events] == ["error"]  # no session.created
            assert second.events[0]["code"] == "capacity"
            await stream(first.ws, float_to_pcm16(np.full(FRAME_24K * 2, 0.2, np.float32)), 16000)
            await first.until(lambda: first.samples().size > 0)  # the first goes on
        assert _refused(stack) == before + 1


async def test_an_unreachable_duplex_service_is_a_clear_error(redis_server: RedisProc) -> None:
    # a port held bound but not listening: refused, and nothing else can take it meanwhile
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        section = GatewaySection(
            backend="duplex",
            duplex_url=f"ws://127.0.0.1:{held.getsockname()[1]}",
            end_of_turn="silence",
        )
        app = gateway_app(GatewaySettings(redis=redis_server.settings(), gateway=section))
        with ServerThread(app) as gateway:
            async with session(f"{gateway.ws}/v1/stream") as client:
                await client.closed()
    assert client.ws.close_code == 1011
    assert [(e["type"], e["code"]) for e in client.events] == [("error", "duplex_unavailable")]
    assert "unreachable" in client.events[0]["message"]


async def test_an_unexpected_failure_is_a_typed_error_not_a_bare_close(
    redis_server: RedisProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*_: Any, **__: Any) -> DuplexLink:
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr(DuplexLink, "open", broken)
    section = GatewaySection(backend="duplex", duplex_url="ws://127.0.0.1:9", end_of_turn="silence")
    app = gateway_app(GatewaySettings(redis=redis_server.settings(), gateway=section))
    with ServerThread(app) as gateway:
        async with session(f"{gateway.ws}/v1/stream") as client:
            await client.closed()
    assert (client.ws.close_code, client.ws.close_reason) == (1011, "internal error (RuntimeError)")
    assert [(e["type"], e["code"], e["fatal"]) for e in client.events] == [
        ("error", "internal", True)
    ]
    assert client.events[0]["message"] == "internal error (RuntimeError)"  # no details


async def test_a_client_close_is_answered_at_once_and_frees_the_slot(stack: DuplexStack) -> None:
    async with session(stack.stream_url) as client:
        await client.event("response.created")
        await stream(client.ws, float_to_pcm16(np.full(FRAME_24K * 10, 0.1, np.float32)), 16000)
        await client.until(lambda: client.samples().size > 0)  # audio flows both ways
        assert _duplex_sessions(stack) >= 1
        async with asyncio.timeout(10):
            await client.ws.close()
    assert client.ws.close_code == 1000
    async with asyncio.timeout(10):
        while _duplex_sessions(stack) or stack.app.state.sessions:
            await asyncio.sleep(0.02)


async def test_a_session_resumes_with_its_settings_and_the_agents_text(
    stack: DuplexStack,
) -> None:
    async with session(stack.stream_url) as client:
        created = await client.event("session.created")
        session_id = created["session"]["id"]
        await client.send({"type": "session.update", "session": {"output_sample_rate": 16000}})
        await client.event("session.updated")
        await stream(client.ws, _speech(16000), 16000)
        await client.until(lambda: len(client.of("response.text.delta")) >= 4)
        await client.send({"type": "session.close"})
        done = await client.event("response.done")
    said = done["text"]
    assert said.startswith("w5 w10 w15 w20")
    async with asyncio.timeout(10):  # the gateway is done with it (saved before response.done)
        while session_id in stack.app.state.sessions:
            await asyncio.sleep(0.01)

    url = f"{stack.stream_url}?session_id={session_id}"
    async with session(url) as again:
        resumed = (await again.event("session.created"))["session"]
        await again.event("response.created")
        history = list(stack.app.state.sessions[session_id].history)
        await stream(again.ws, float_to_pcm16(np.full(FRAME_24K * 6, 0.1, np.float32)), 16000)
        deltas = await again.event("response.text.delta")
    assert resumed["id"] == session_id and resumed["resumed"] is True
    assert resumed["output_sample_rate"] == 16000
    # the agent's text, split where the user started speaking; a fresh model (it counts
    # its frames from one again)
    assert " ".join(t.text for t in history) == said
    assert {t.role for t in history} == {"agent"}
    assert deltas["delta"] == " w5"


async def test_a_duplex_service_going_away_ends_the_session_clearly(
    redis_server: RedisProc,
) -> None:
    with duplex_stack(redis_server.settings()) as stack:
        async with session(stack.stream_url) as client:
            await client.event("response.created")
            await stream(client.ws, float_to_pcm16(np.full(FRAME_24K * 3, 0.1, np.float32)), 24000)
            await client.until(lambda: client.samples().size > 0)
            stack.duplex.server.should_exit = True  # uvicorn closes its sessions (1012)
            await client.closed()
    assert client.ws.close_code == 1011
    done, error = client.of("response.done")[0], client.of("error")[0]
    assert done["status"] == "failed"
    assert error["code"] == "duplex_unavailable" and error["fatal"] is True
    assert "ended the session (close 1012" in error["message"]
    assert [e["type"] for e in client.events][-2:] == ["response.done", "error"]


async def test_a_drain_closes_duplex_sessions_with_1012_and_frees_their_slots(
    redis_server: RedisProc,
) -> None:
    with duplex_stack(redis_server.settings()) as stack:
        async with session(stack.stream_url) as client:
            await client.event("response.created")
            await stream(client.ws, float_to_pcm16(np.full(FRAME_24K * 2, 0.1, np.float32)), 24000)
            await client.until(lambda: client.samples().size > 0)
            async with httpx.AsyncClient(base_url=stack.gateway.http, timeout=30) as http:
                drained = await http.post("/admin/drain", params={"grace_s": 0, "wait_s": 10})
                refused = await http.get("/ready")
            await client.closed()
        assert drained.json()["closed_1012"] == 1 and drained.json()["remaining"] == 0
        assert refused.status_code == 503
        assert client.ws.close_code == 1012
        async with asyncio.timeout(10):
            while _duplex_sessions(stack):
                await asyncio.sleep(0.02)


async def test_a_g711_session_hears_the_echo_in_mu_law(stack: DuplexStack) -> None:
    """Telephone audio on the duplex backend: the codec undoes mu-law both ways, the
    session's resamplers go 8 kHz <-> the model's 24 kHz (docs/telephony.md)."""
    from services.common.audio import g711

    async with session(stack.stream_url) as client:
        await client.event("response.created")
        formats = {"input_format": "pcmu", "output_format": "pcmu"}
        await client.send({"type": "session.update", "session": formats})
        updated = await client.event("session.updated")
        assert updated["session"]["input_sample_rate"] == 8000
        pcm = _speech(8000)
        coded = g711.encode(pcm, "pcmu")
        for start in range(0, len(coded), 160):  # 20 ms frames of mu-law bytes
            await client.ws.send(coded[start : start + 160])
        frames = len(pcm) // 2 // 640  # 80 ms model frames, at 8 kHz
        await client.until(lambda: len(client.audio) >= (frames - 1) * 640)
        await client.send({"type": "session.close"})
        await client.closed()
    sent = pcm16_to_float(g711.decode(coded, "pcmu"))
    heard = pcm16_to_float(g711.decode(bytes(client.audio), "pcmu"))  # one byte a sample
    lag, gain, correlation = lag_and_gain(sent, heard, 640 + 200)
    assert 640 <= lag < 640 + 80  # one model frame late, and the filters' few ms
    assert gain == pytest.approx(0.5, abs=0.05)
    assert correlation > 0.95


async def test_a_reconnect_while_the_old_socket_is_open_takes_the_session_over(
    redis_server: RedisProc,
) -> None:
    """The client's network changed: it reconnects with its session id before the gateway
    saw the old socket die. The old connection is closed ('resumed on another connection')
    and its duplex slot freed; the new one gets the session, settings included (it got a
    new session and held a second slot: with one slot, a 1013)."""
    with duplex_stack(redis_server.settings(), max_sessions=2) as stack:
        async with session(stack.stream_url) as old:
            session_id = (await old.event("session.created"))["session"]["id"]
            await old.send({"type": "session.update", "session": {"voice": "kept-voice"}})
            await old.event("session.updated")
            await stream(old.ws, float_to_pcm16(np.full(FRAME_24K * 2, 0.1, np.float32)), 24000)
            await old.until(lambda: old.samples().size > 0)
            async with session(f"{stack.stream_url}?session_id={session_id}") as new:
                created = (await new.event("session.created"))["session"]
                await new.event("response.created")
                await old.closed()
                async with asyncio.timeout(10):  # one slot: the old one is freed
                    while _duplex_sessions(stack) != 1:
                        await asyncio.sleep(0.02)
                await stream(new.ws, float_to_pcm16(np.full(FRAME_24K * 2, 0.1, np.float32)), 24000)
                await new.until(lambda: new.samples().size > 0)
    assert (created["id"], created["resumed"], created["voice"]) == (session_id, True, "kept-voice")
    assert (old.ws.close_code, old.ws.close_reason) == (1000, "resumed on another connection")


async def test_a_session_resumed_through_another_gateway_ends_on_the_first(
    redis_server: RedisProc,
) -> None:
    """One writer per stored session: once another gateway claimed it, the first one's
    save is refused and its old connection closed ('resumed on another connection'),
    freeing its duplex slot, as for the cascade."""
    settings = redis_server.settings()
    with duplex_stack(settings, max_sessions=2) as stack:
        section = GatewaySection(
            backend="duplex", duplex_url=stack.duplex.ws, end_of_turn="silence"
        )
        other = gateway_app(GatewaySettings(redis=settings, gateway=section))
        with ServerThread(other) as second:
            async with session(stack.stream_url) as old:
                session_id = (await old.event("session.created"))["session"]["id"]
                await old.send({"type": "session.update", "session": {"voice": "v1"}})
                await old.event("session.updated")
                await _until_stored(settings, session_id)
                async with session(f"{second.ws}/v1/stream?session_id={session_id}") as new:
                    created = (await new.event("session.created"))["session"]
                    await old.send({"type": "session.update", "session": {"voice": "v2"}})
                    await old.closed()
                    async with asyncio.timeout(10):
                        while session_id in stack.app.state.sessions or _duplex_sessions(stack) > 1:
                            await asyncio.sleep(0.02)
                    assert session_id in other.state.sessions  # the new one goes on
    assert (created["id"], created["resumed"], created["voice"]) == (session_id, True, "v1")
    assert (old.ws.close_code, old.ws.close_reason) == (1000, "resumed on another connection")


async def _until_stored(settings: RedisSettings, session_id: str) -> None:
    """Wait for the session's record (a gateway saves it just after `session.updated`)."""
    client = Redis.from_url(settings.url)
    try:
        async with asyncio.timeout(10):
            while not await client.exists(Keys(settings.prefix).session(session_id)):
                await asyncio.sleep(0.02)
    finally:
        await client.aclose()
