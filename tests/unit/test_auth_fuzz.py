"""A fuzz of the credential forms at the door: 10 000 seeded random HTTP requests and
WebSocket handshakes (Authorization headers, subprotocols, query strings, Origins), each
answered by the guard on a real Redis: never a 5xx, never the app without a valid
credential, always the app with one."""

from __future__ import annotations

import random
import string
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import SecretStr

from services.common.auth.api_keys import KeyStore
from services.common.auth.credentials import TOKEN_SUBPROTOCOL, sign_token
from services.common.auth.guard import AuthGuard
from services.common.auth.settings import AuthSettings, DefaultLimits
from services.common.bus.connection import connect
from tests.conftest import RedisProc

CASES = 10_000
SECRET = "fuzz-signing-secret-" + "k" * 32
SETTINGS = AuthSettings(
    required=True,
    token_secret=SecretStr(SECRET),
    allowed_origins=["https://ok.example"],
    limits=DefaultLimits(
        sessions=10**6,
        sessions_per_minute=10**6,
        requests_per_minute=10**7,
        audio_seconds_per_day=10**6,
    ),
)
PATHS = ["/v1/stream", "/v1/stream/tts", "/v1/audio/speech", "/v1/voices", "/x", "/health"]
JUNK = string.printable + "é\x00\x7f\u2028ü€"


class Door:
    """The guard in front of an app that notes each request that reached it."""

    def __init__(self, guard_of: Any) -> None:
        self.reached = 0
        self.guard = guard_of(self.app)

    async def app(self, scope: Any, receive: Any, send: Any) -> None:
        self.reached += 1
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})

    async def knock(self, scope: dict[str, Any]) -> tuple[int, bool]:
        """(status, whether the app was reached); a WebSocket close before accept is 403."""
        sent: list[dict[str, Any]] = []
        before = self.reached

        async def receive() -> dict[str, Any]:
            return {"type": "websocket.connect" if scope["type"] == "websocket" else "http.request"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await self.guard(scope, receive, send)
        starts = [m for m in sent if m["type"].endswith("http.response.start")]
        status = starts[0]["status"] if starts else 403 if sent else 200
        return status, self.reached > before


def _junk(rng: random.Random, longest: int = 80) -> str:
    return "".join(rng.choice(JUNK) for _ in range(rng.randrange(longest)))


def _mutate(rng: random.Random, text: str) -> str:
    i = rng.randrange(len(text))
    return rng.choice([text[:i], text[:i] + _junk(rng, 4) + text[i + 1 :], text + text[i:]])


@pytest.fixture
async def door(redis_server: RedisProc) -> AsyncIterator[tuple[Door, list[str]]]:
    redis_settings = redis_server.settings()
    client = connect(redis_settings)
    record, plain = await KeyStore(client, redis_settings.prefix).create("fuzz", "f")
    valid = [plain, sign_token(SECRET.encode(), "fuzz", record.id, 600, {})[0]]
    yield Door(lambda app: AuthGuard(app, SETTINGS, client, redis_settings.prefix, "fuzz")), valid
    await client.aclose()


def random_case(rng: random.Random, valid: list[str]) -> tuple[dict[str, Any], bool | None]:
    """A scope and whether it must reach the app (None: either, it is not ours to say)."""
    kind = rng.choice(["http", "websocket"])
    path = rng.choice(PATHS)
    headers: list[tuple[bytes, bytes]] = [(b"host", b"gw.example")]
    subprotocols: list[str] = []
    query = ""
    expect: bool | None = False
    credential = rng.choice(valid)
    form = rng.randrange(10)
    if form == 0:
        headers.append((b"authorization", f"Bearer {credential}".encode()))
        expect = True
    elif form == 1 and kind == "websocket":
        subprotocols = ["voice-agent.v1", TOKEN_SUBPROTOCOL + credential]
        expect = True
    elif form == 2 and kind == "websocket":
        query = f"access_token={credential}&session_id={_junk(rng, 10)}"
        expect = not credential.startswith("va_")  # a key never rides in a URL
    elif form == 3:
        value = rng.choice(["Bearer ", "bearer  ", "Basic ", "", "Token "]) + _mutate(
            rng, credential
        )
        headers.append((b"authorization", value.encode("latin-1", "replace")))
        expect = None
    elif form == 4:
        headers.append((b"authorization", _junk(rng).encode("latin-1", "replace")))
    elif form == 5:
        raw = bytes(rng.randrange(256) for _ in range(rng.randrange(60)))
        headers.append((b"authorization", raw))
        expect = None if raw.startswith(b"Bearer va_") else False
    elif form == 6 and kind == "websocket":
        subprotocols = [_junk(rng, 20), TOKEN_SUBPROTOCOL + _junk(rng, 200)]
    elif form == 7:
        query = "&".join(f"{_junk(rng, 8)}={_junk(rng, 20)}" for _ in range(rng.randrange(5)))
        query += rng.choice(["", "&access_token=", "&access_token=" + _junk(rng, 50)])
    elif form == 8:
        headers += [(b"authorization", f"Bearer {credential}".encode())] * 2
    # form 9 (and forms meant for WebSockets drawn for HTTP): no credential at all
    if path == "/health":
        expect = True  # open to all, credential or not
    if kind == "websocket" and rng.random() < 0.2:
        origin = rng.choice(["https://evil.example", "https://ok.example", "null", _junk(rng, 30)])
        headers.append((b"origin", origin.encode("latin-1", "replace")))
        if origin != "https://ok.example":
            expect = False if expect is not None else None
    scope: dict[str, Any] = {
        "type": kind,
        "path": path,
        "headers": headers,
        "query_string": query.encode("latin-1", "replace"),
    }
    if kind == "websocket":
        scope["subprotocols"] = subprotocols
        scope["extensions"] = {"websocket.http.response": {}} if rng.random() < 0.9 else {}
    return scope, expect


async def test_ten_thousand_credential_forms_never_a_5xx(door: tuple[Door, list[str]]) -> None:
    guard, valid = door
    rng = random.Random(13)
    statuses: dict[int, int] = {}
    for _ in range(CASES):
        scope, expect = random_case(rng, valid)
        status, reached = await guard.knock(scope)
        assert status < 500, scope
        assert status in (200, 401, 403, 429), scope
        if expect is not None:
            assert reached == expect, scope
        statuses[status] = statuses.get(status, 0) + 1
    assert statuses[401] > 1000 and statuses[200] > 1000  # both sides of the door were tried
