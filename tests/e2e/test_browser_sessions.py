"""The browser page keeps its session when the connection does not: gateways that drain one
after another (a rolling restart), a network that drops or goes dead without a word, a
gateway gone for longer than the page retries; and, with authentication on, it uses the
token the user pastes (the tenant's lists, the settings the token was minted with) and says
why the gateway refused it. Headless Chromium against fake-profile gateways behind a TCP
proxy (nginx in miniature); the microphone is silence. Waits are on the page's state
(window.voiceAgent), never on time.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from services.common.auth.settings import AuthSettings, DefaultLimits
from services.common.bus.settings import RedisSettings
from services.gateway.admission import AdmissionSettings
from services.gateway.app import create_app
from services.gateway.settings import GatewaySection, GatewaySettings
from services.ops.redis_server import free_port
from services.tts.app import create_app as tts_app
from services.tts.settings import TtsSettings
from tests.conftest import RedisProc
from tests.e2e.test_auth import new_key, revoke
from tests.e2e.test_browser import (
    CHROMIUM,
    in_a_thread,
    launch_chromium,
    wait_on,
)
from tests.servers import ServerThread

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="needs Debian's chromium (scripts/system_deps.sh)"
)

HOOKS = """(() => {
  // every socket the page opens; one marked `__stuck` says its send buffer is full (16 MB
  // not sent), as a socket on a dead network does
  const Native = window.WebSocket;
  window.__sockets = [];
  window.WebSocket = class extends Native {
    constructor(...args) { super(...args); window.__sockets.push(this); }
  };
  const buffered = Object.getOwnPropertyDescriptor(Native.prototype, "bufferedAmount").get;
  Object.defineProperty(Native.prototype, "bufferedAmount", {
    get() { return this === window.__stuck ? 1 << 24 : buffered.call(this); },
  });
  // every text the status line shows
  window.__statuses = [];
  document.addEventListener("DOMContentLoaded", () => {
    new MutationObserver((records) => {
      for (const r of records) for (const n of r.addedNodes) window.__statuses.push(n.textContent);
    }).observe(document.getElementById("status"), { childList: true });
  });
})();"""

FAST_RETRIES = "Object.assign(window.voiceAgent.config, {retryBaseMs: 100, retryMaxMs: 500})"
LIVE_AGAIN = "n => window.voiceAgent.state === 'live' && window.voiceAgent.resumes >= n"
ENDED = "n => window.voiceAgent.state === 'idle' && window.voiceAgent.closes.length > n"


@pytest.fixture(scope="module")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    wav = tmp_path_factory.mktemp("mic") / "quiet.wav"
    with wave.open(str(wav), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(48000)
        out.writeframes(bytes(2 * 48000))
    with launch_chromium(wav) as launched:
        yield launched


class Proxy:
    """A TCP proxy in front of the gateways: `target` (a port) may change between
    connections, `drop()` resets every open one, `stall()` holds every byte both ways (a
    network gone dead without a word) until `flow()`."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._open: set[asyncio.StreamWriter] = set()
        self._flowing = asyncio.Event()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> Proxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *_: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _start(self) -> None:
        self._flowing.set()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def _stop(self) -> None:
        """Every connection reset, every task ended: nothing left for a later test's
        garbage collection to complain about."""
        self._server.close()
        self._flowing.set()
        for writer in self._open:
            writer.transport.abort()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.transport.abort()
            return
        self._open |= {writer, up_writer}
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            self._open -= {writer, up_writer}
            writer.transport.close()
            up_writer.transport.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Forward one way, holding the bytes while the network is stalled. The end is a
        half-close, as TCP's, and a side is read to its end even when the other is gone: a
        socket closed with bytes unread resets its peer, and a reset loses what that peer
        has not read yet (the gateway's close frame). Reading goes on while stalled, for
        the same reason."""
        held: asyncio.Queue[bytes] = asyncio.Queue()

        async def read() -> None:
            try:
                while data := await reader.read(65536):
                    held.put_nowait(data)
            except OSError:
                pass
            finally:
                held.put_nowait(b"")

        reading = asyncio.create_task(read())
        broken = False  # the other side is gone: read on (and drop) until this one ends
        try:
            while data := await held.get():
                await self._flowing.wait()
                if not broken:
                    try:
                        writer.write(data)
                        await writer.drain()
                    except OSError:
                        broken = True
        finally:
            await self._flowing.wait()
            reading.cancel()
            with contextlib.suppress(OSError):
                writer.write_eof()

    def drop(self) -> None:
        def reset() -> None:
            for writer in self._open:
                writer.transport.abort()

        self._loop.call_soon_threadsafe(reset)

    def stall(self) -> None:
        self._loop.call_soon_threadsafe(self._flowing.clear)

    def flow(self) -> None:
        self._loop.call_soon_threadsafe(self._flowing.set)


def _gateway(redis: RedisSettings, **settings: Any) -> ServerThread:
    section = GatewaySection(
        end_of_turn="silence",
        admission=AdmissionSettings(enabled=False),
        **{"tts_url": None, **settings.pop("gateway", {})},
    )
    return ServerThread(
        create_app(GatewaySettings(profile="fake", redis=redis, gateway=section, **settings))
    )


def _drain(gateway: ServerThread) -> None:
    report = httpx.post(f"{gateway.http}/admin/drain?grace_s=0&wait_s=10", timeout=30).json()
    assert report["closed_1012"] == 1 and report["remaining"] == 0, report


def _sessions(gateway: ServerThread) -> int:
    count: int = httpx.get(f"{gateway.http}/health").json()["sessions"]
    return count


def test_the_page_keeps_its_session_through_restarts_drops_and_dead_networks(
    redis_server: RedisProc, browser: Any
) -> None:
    redis = redis_server.settings()
    with (
        _gateway(redis) as first,
        _gateway(redis) as second,
        _gateway(redis) as third,
        Proxy(first.port) as proxy,
    ):
        # the third gateway pings fast: a stalled network ends its side soon
        third.server.config.ws_ping_interval = third.server.config.ws_ping_timeout = 1.0
        page = browser.new_page()
        page.add_init_script(HOOKS)
        page.goto(f"http://127.0.0.1:{proxy.port}/")
        page.evaluate(FAST_RETRIES)
        page.click("#connect")
        wait_on(page, "window.voiceAgent.state === 'live'")
        session = page.evaluate("window.voiceAgent.sessionId")

        def live_again(times: int) -> None:
            wait_on(page, LIVE_AGAIN, 30, times)
            assert page.evaluate("window.voiceAgent.sessionId") == session

        # a rolling restart: the first gateway drains (1012) while the proxy still leads to
        # it, so the page's reconnect meets the drain (1013); it tries again, later
        _drain(first)
        wait_on(page, "window.voiceAgent.closes.some(c => c.code === 1013)")
        # not sooner than the drain's error said (`retry_after_s` 1), though the backoff
        # alone would have waited at most 0.625 s
        waits = [
            float(m[1])
            for s in page.evaluate("window.__statuses")
            if "is draining" in s
            and (m := re.search(r"Reconnecting to session \S+ in ([\d.]+) s", s))
        ]
        assert waits and waits[0] >= 1.0, waits
        proxy.target = second.port
        live_again(1)
        # then the second gateway drains too: the page follows again, to the third
        proxy.target = third.port
        _drain(second)
        live_again(2)
        # the network drops (a reset: no close frame at all, 1006)
        proxy.drop()
        live_again(3)
        assert page.evaluate("window.voiceAgent.closes.at(-1).code") == 1006

        # the network goes dead without a word: the socket stops sending. Past 1 s of audio
        # unsent the page stops queueing, gives that socket up and takes the session up on
        # a new one (the gateway hands it over from the old connection)
        page.evaluate("window.__stuck = window.__sockets.at(-1)")
        live_again(4)
        stall = page.evaluate(
            "({stalls: window.voiceAgent.stalls, unsent: window.voiceAgent.counters.unsentFrames,"
            " closed: window.__stuck.readyState >= WebSocket.CLOSING,"
            " reason: window.voiceAgent.closes.at(-1).reason})"
        )
        assert stall["stalls"] == 1 and stall["unsent"] >= 1 and stall["closed"], stall
        assert "stopped taking the audio" in stall["reason"], stall
        told = [s for s in page.evaluate("window.__statuses") if "stopped taking the audio" in s]
        assert told and f"Reconnecting to session {session}" in told[0], told

        # the network stalls until the gateway's keepalive gives up on the page: its close
        # (1011 "keepalive ping timeout") arrives when the network is back, and is a lost
        # connection, not an internal error
        proxy.stall()
        deadline = time.monotonic() + 30
        while _sessions(third):
            assert time.monotonic() < deadline, "the gateway kept the stalled session"
            time.sleep(0.05)
        proxy.flow()
        live_again(5)
        keepalive = page.evaluate(
            "window.voiceAgent.closes.find(c => c.code === 1011 && c.reason.includes('keepalive'))"
        )
        assert keepalive and keepalive["message"].startswith("Connection lost"), page.evaluate(
            "window.voiceAgent.closes"
        )

        # the gateway is gone for longer than the page retries: it gives up, says so, keeps
        # the session's id, and Connect takes it up again
        # (its retries' budget began anew when the session was live again)
        page.evaluate("window.voiceAgent.config.retryForMs = 1500; window.__statuses = []")
        proxy.target = free_port()  # nothing listens there
        proxy.drop()
        wait_on(page, "window.voiceAgent.state === 'idle'")
        status = page.inner_text("#status")
        assert "Gave up reconnecting" in status and session in status, status
        assert page.is_enabled("#connect")
        statuses = page.evaluate("window.__statuses")
        assert any(f"Reconnecting to session {session}" in s for s in statuses), statuses
        assert any("unreachable" in s for s in statuses), statuses
        proxy.target = third.port
        page.click("#connect")
        live_again(6)
        page.click("#disconnect")
        wait_on(page, "window.voiceAgent.state === 'idle'")
        assert page.evaluate("window.voiceAgent.closes.at(-1).code") == 1000


AUTH = AuthSettings(
    required=True,
    token_secret=SecretStr("browser-sessions-secret-" + "k" * 32),
    limits=DefaultLimits(
        sessions=50,
        sessions_per_minute=10_000,
        requests_per_minute=10_000,
        audio_seconds_per_day=100_000,
    ),
)


def test_with_auth_on_the_page_works_with_the_token_it_is_given(
    redis_server: RedisProc, browser: Any, one_utc_day: None
) -> None:
    redis = redis_server.settings()
    with (
        ServerThread(tts_app(TtsSettings(profile="fake", redis=redis, auth=AUTH))) as tts,
        _gateway(redis, auth=AUTH, gateway={"tts_url": tts.http}) as gateway,
    ):
        _, keeps = in_a_thread(new_key(redis, "acme"))
        lent_id, lent = in_a_thread(new_key(redis, "acme"))
        _, tight = in_a_thread(new_key(redis, "tight", audio_seconds_per_day=1))

        def token(key: str, **body: Any) -> str:
            minted = httpx.post(
                f"{gateway.http}/v1/sessions", json=body, headers={"Authorization": f"Bearer {key}"}
            )
            minted.raise_for_status()
            value: str = minted.json()["token"]
            return value

        page = browser.new_page()
        page.add_init_script(HOOKS)
        sent: list[str] = []
        page.on("websocket", lambda ws: ws.on("framesent", lambda f: sent.append(str(f))))
        page.goto(f"{gateway.http}/")
        wait_on(page, "document.querySelector('#log').textContent.includes('(HTTP 401)')")
        page.evaluate(FAST_RETRIES)

        # a wrong token: refused at the upgrade, which a page sees only as a 1006; the page
        # asks the REST API with the same token and names the refusal
        page.fill("#token", "not-a-token")
        page.click("#connect")
        wait_on(page, "window.voiceAgent.state === 'idle' && window.voiceAgent.closes.length > 0")
        status = page.inner_text("#status")
        assert "HTTP 401 unauthorized" in status and "unreachable" not in status, status

        # a token pasted in the field (README's way): the lists are asked again with it
        page.fill("#token", token(lent, session={"voice": "fake", "agent": "openai"}))
        page.click("#connect")
        wait_on(page, "window.voiceAgent.state === 'live'")
        wait_on(page, "document.querySelectorAll('#agent option').length >= 2")
        wait_on(
            page, "[...document.querySelectorAll('#voice option')].some(o => o.value === 'fake')"
        )
        # the session keeps the voice and agent its token was minted with: the page sends
        # its rates only, and its pickers show what the gateway says
        session = page.evaluate("window.voiceAgent.session")
        assert (session["voice"], session["agent"]) == ("fake", "openai"), session
        assert (page.input_value("#voice"), page.input_value("#agent")) == ("fake", "openai")
        updates = [f for f in sent if "session.update" in f]
        assert updates and not [f for f in updates if '"voice"' in f or '"agent"' in f], updates
        # what the user picks is sent
        page.select_option("#agent", "echo")
        wait_on(page, "window.voiceAgent.session.agent === 'echo'")
        session_id = session["id"]

        # the token stops opening sessions (as one past its lifetime: revoked here, to save
        # its 10 s at least) and the connection is lost: the reconnect is refused; the page
        # says a new token is needed, and a new one resumes the session
        in_a_thread(revoke(redis, lent_id))
        page.evaluate("window.__stuck = window.__sockets.at(-1)")
        wait_on(page, "window.voiceAgent.state === 'idle'")
        status = page.inner_text("#status")
        assert (
            "HTTP 401" in status
            and f"Paste a new token and press Connect to resume session {session_id}" in status
        ), status
        page.fill("#token", token(keeps))
        page.click("#connect")
        wait_on(page, LIVE_AGAIN, 30, 1)
        resumed = page.evaluate("window.voiceAgent.session")
        assert (resumed["id"], resumed["agent"]) == (session_id, "echo"), resumed
        page.click("#disconnect")
        wait_on(page, "window.voiceAgent.state === 'idle'")

        # the tenant's daily audio quota runs out mid-session (1008): the page names it
        closes = page.evaluate("window.voiceAgent.closes.length")
        page.fill("#token", token(tight))
        page.click("#connect")
        wait_on(page, ENDED, 30, closes)
        close = page.evaluate("window.voiceAgent.closes.at(-1)")
        status = page.inner_text("#status")
        assert close["code"] == 1008 and "daily audio quota" in status, (close, status)
        assert "check the token" not in status, status
        # and the next session is refused at the upgrade (429), which the page cannot see;
        # the REST API accepts the token, so the page says a limit refused it
        closes = page.evaluate("window.voiceAgent.closes.length")
        page.fill("#token", token(tight))
        page.click("#connect")
        wait_on(page, ENDED, 30, closes)
        status = page.inner_text("#status")
        assert "daily audio quota" in status and "unreachable" not in status, status
