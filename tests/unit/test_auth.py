"""The pure parts of authentication: credential forms, tokens, the bind check, redaction,
`voice-agent up`'s development default and `voice-agent keys`."""

from __future__ import annotations

import base64
import json
from typing import Any

import jwt
import pytest
from pydantic import SecretStr, ValidationError
from starlette.requests import Request

from services.common.auth.api_keys import KeyStore
from services.common.auth.credentials import (
    APP_SUBPROTOCOL,
    TOKEN_SUBPROTOCOL,
    app_subprotocol,
    credential,
    exposure_problem,
    sign_token,
    verify_token,
)
from services.common.auth.guard import PRINCIPAL
from services.common.auth.relay import relay_headers
from services.common.auth.settings import AuthSettings, DefaultLimits, Limits
from services.common.bus.connection import connect as redis_connect
from services.common.errors import Unauthorized
from services.common.redact import redact
from services.common.service.server import run_service
from services.common.tenancy import TENANT
from services.gateway.settings import GatewaySettings
from services.ops import cli
from tests.conftest import RedisProc

SECRET = b"unit-test-secret-" + b"u" * 32


def scope(kind: str = "http", headers: Any = (), query: bytes = b"", protocols: Any = ()) -> Any:
    return {
        "type": kind,
        "headers": list(headers),
        "query_string": query,
        "subprotocols": protocols,
    }


def test_credential_forms() -> None:
    assert credential(scope(headers=[(b"authorization", b"Bearer abc")])) == "abc"
    assert credential(scope(headers=[(b"Authorization", b"  bearer   abc ")])) == "abc"
    assert credential(scope()) is None
    ws = scope("websocket", protocols=[APP_SUBPROTOCOL, TOKEN_SUBPROTOCOL + "tok"])
    assert credential(ws) == "tok"
    assert credential(scope("websocket", query=b"a=1&access_token=q")) == "q"
    assert credential(scope("http", query=b"access_token=q")) is None  # never on REST
    for bad in (b"Basic abc", b"Bearer", b"Bearer \xe9\xe9", b"abc"):
        with pytest.raises(Unauthorized):
            credential(scope(headers=[(b"authorization", bad)]))
    twice = [(b"authorization", b"Bearer a"), (b"authorization", b"Bearer b")]
    with pytest.raises(Unauthorized):
        credential(scope(headers=twice))
    with pytest.raises(Unauthorized):
        credential(scope("websocket", query=b"access_token="))


def test_an_api_key_is_refused_in_the_query_string() -> None:
    """URLs end up in logs: only a client token may ride in ?access_token=, never a key,
    however it is encoded."""
    key = "va_0123456789ab_" + "A" * 43
    for query in (f"access_token={key}", "access%5Ftoken=" + key.replace("_", "%5F")):
        with pytest.raises(Unauthorized, match="may not travel in the URL"):
            credential(scope("websocket", query=query.encode()))
    bearer = [(b"authorization", f"Bearer {key}".encode())]
    assert credential(scope("websocket", headers=bearer)) == key


def test_the_accepted_subprotocol_is_never_the_token() -> None:
    assert app_subprotocol([APP_SUBPROTOCOL, TOKEN_SUBPROTOCOL + "t"]) == APP_SUBPROTOCOL
    assert app_subprotocol([TOKEN_SUBPROTOCOL + "t"]) is None
    assert app_subprotocol(None) is None


def test_tokens_expire_and_are_bound_to_their_secret() -> None:
    token, expires_at = sign_token(SECRET, "acme", "k1", 60, {"voice": "alba"})
    claims = verify_token(SECRET, token)
    assert (claims["sub"], claims["kid"], claims["session"]) == ("acme", "k1", {"voice": "alba"})
    assert claims["exp"] == expires_at
    with pytest.raises(Unauthorized, match="expired"):
        verify_token(SECRET, sign_token(SECRET, "acme", "k1", -1, {})[0])
    with pytest.raises(Unauthorized):
        verify_token(b"another-secret-" + b"x" * 32, token)
    unsigned = jwt.encode(jwt.decode(token, options={"verify_signature": False}), None, "none")
    with pytest.raises(Unauthorized):
        verify_token(SECRET, unsigned)  # alg "none" is never accepted
    head, _, sig = token.split(".")
    claims["sub"] = "evil"
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    with pytest.raises(Unauthorized):
        verify_token(SECRET, f"{head}.{forged}.{sig}")


def test_a_relay_token_is_a_token_with_a_relay_claim() -> None:
    relay, _ = sign_token(SECRET, "acme", "k1", 60, {}, relay=True)
    assert verify_token(SECRET, relay)["relay"] is True
    assert "relay" not in verify_token(SECRET, sign_token(SECRET, "acme", "k1", 60, {})[0])
    claims = jwt.decode(relay, SECRET, algorithms=["HS256"], audience="voice-agent")
    odd = jwt.encode({**claims, "relay": "yes"}, SECRET, algorithm="HS256")
    with pytest.raises(Unauthorized):
        verify_token(SECRET, odd)


async def test_a_relay_token_names_the_callers_tenant_and_dies_with_its_key(
    redis_server: RedisProc,
) -> None:
    redis_settings = redis_server.settings()
    client = redis_connect(redis_settings)
    try:
        keys = KeyStore(client, redis_settings.prefix, SECRET.decode())
        record, plain = await keys.create("acme", "t")
        caller = await keys.principal(plain, DefaultLimits())
        request = Request({"type": "http", "headers": [], PRINCIPAL: caller})
        headers = await relay_headers(request, keys)
        relayed = await keys.principal(headers["Authorization"].removeprefix("Bearer "), Limits())
        assert (relayed.tenant, relayed.kind, relayed.key_id) == ("acme", "relay", record.id)
        anonymous = Request({"type": "http", "headers": []})
        assert await relay_headers(anonymous, keys) == {}  # authentication off: nothing
        await keys.revoke(record.id)
        with pytest.raises(Unauthorized):
            await keys.principal(headers["Authorization"].removeprefix("Bearer "), Limits())
    finally:
        await client.aclose()


def test_a_short_token_secret_is_refused() -> None:
    with pytest.raises(ValidationError):
        AuthSettings(token_secret=SecretStr("short"))
    assert AuthSettings(token_secret=SecretStr("")).required  # on unless said otherwise


def test_authentication_off_is_for_loopback_only() -> None:
    off, on = AuthSettings(required=False), AuthSettings(required=True)
    for host in ("127.0.0.1", "::1", "[::1]", "localhost", "127.0.0.2"):
        assert exposure_problem(off, host) is None
    for host in ("0.0.0.0", "::", "10.0.0.5", "voice.example.com"):
        assert "refusing to serve" in (exposure_problem(off, host) or "")
        assert exposure_problem(on, host) is None


def test_a_service_refuses_to_start_open_on_a_public_bind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VA_AUTH__REQUIRED", "false")

    def never(settings: GatewaySettings) -> Any:
        raise AssertionError("the app must not be built")

    with pytest.raises(SystemExit, match=r"refusing to serve on 0\.0\.0\.0"):
        run_service(
            "gateway", GatewaySettings, never, lambda s: s.gateway.server, ["--host", "0.0.0.0"]
        )


def test_voice_agent_up_turns_authentication_off_on_loopback_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("VA_AUTH__REQUIRED")
    assert cli._service_env()["VA_AUTH__REQUIRED"] == "false"
    monkeypatch.setenv("VA_GATEWAY__SERVER__HOST", "0.0.0.0")
    assert "VA_AUTH__REQUIRED" not in cli._service_env()
    monkeypatch.setenv("VA_AUTH__REQUIRED", "true")
    monkeypatch.delenv("VA_GATEWAY__SERVER__HOST")
    assert cli._service_env()["VA_AUTH__REQUIRED"] == "true"


def test_redaction() -> None:
    token = sign_token(SECRET, "acme", "k1", 60, {})[0]
    key = "va_0123456789ab_" + "A" * 43
    line = (
        f"GET /v1/stream?session_id=s&access_token={token} Bearer {key} voice-agent.token.{token}"
    )
    cleaned = redact(line)
    assert token not in cleaned and key not in cleaned
    assert cleaned.startswith("GET /v1/stream?[redacted] ")  # a request line's whole query
    assert redact("nothing secret here") == "nothing secret here"


def test_redaction_sees_through_percent_encoding() -> None:
    """What the services decode (parse_qsl) the filter must too: `access%5Ftoken=`, `%2E`
    for a JWT's dots, `%5F` in a key, in a request line or anywhere else."""
    token = sign_token(SECRET, "acme", "k1", 60, {})[0]
    key = "va_0123456789ab_" + "A" * 43
    hidden = [
        "access%5Ftoken=" + token.replace(".", "%2E"),
        "access%5Ftoken=" + key.replace("_", "%5F"),
        "access%255Ftoken=" + key.replace("_", "%255F"),  # encoded twice
    ]
    for query in hidden:
        line = f'127.0.0.1:5 - "WebSocket /v1/stream?{query}" [accepted]'
        assert redact(line) == '127.0.0.1:5 - "WebSocket /v1/stream?[redacted]" [accepted]'
        cleaned = redact(f"a client sent {query} somehow")
        assert token.split(".")[2] not in cleaned and key[16:] not in cleaned, cleaned
    assert redact("100% of %41 stays") == "100% of %41 stays"


def test_decoding_for_redaction_writes_no_line_of_its_own() -> None:
    """A path that decodes to a credential and a newline: the credential goes, and the
    newline stays escaped (decoded, it would start a log line the client wrote)."""
    forged = "%0A2026-05-09 12:00:00 INFO admin key rotated by ops"
    line = f'1.2.3.4:5 - "WebSocket /v1/stream/access_token%3Dsecret.x.y{forged}" 403'
    cleaned = redact(line)
    assert "\n" not in cleaned and "\r" not in cleaned and "%0A2026" in cleaned, cleaned
    assert "access_token=[redacted]" in cleaned


@pytest.fixture
def keys_redis(redis_server: RedisProc, monkeypatch: pytest.MonkeyPatch) -> None:
    """`voice-agent keys` on a Redis (and a prefix) of this test's own."""
    redis = redis_server.settings()
    monkeypatch.setenv("VA_REDIS__URL", redis.url)
    monkeypatch.setenv("VA_REDIS__PREFIX", redis.prefix)


def test_keys_create_list_revoke(keys_redis: None, capsys: pytest.CaptureFixture[str]) -> None:
    cli.main(["keys", "create", "--tenant", "acme", "--name", "ci", "--sessions", "3"])
    out, err = capsys.readouterr()
    key_id = out.strip().split("_")[1]
    assert f"key {key_id} for tenant acme" in err
    cli.main(["keys", "list", "--json"])
    listed = json.loads(capsys.readouterr().out)
    assert listed["limits"] == {"sessions": 3} and not listed["revoked"]
    cli.main(["keys", "revoke", key_id])
    capsys.readouterr()
    cli.main(["keys", "list", "--json"])
    assert json.loads(capsys.readouterr().out)["revoked"]
    with pytest.raises(SystemExit, match="no key"):
        cli.main(["keys", "revoke", "000000000000"])
    with pytest.raises(SystemExit, match="tenant"):
        cli.main(["keys", "create", "--tenant", "bad tenant!"])


@pytest.mark.parametrize("name", ["acme\n", "acme\r\n", "\nacme", "", "a" * 65, "bad tenant"])
def test_not_a_tenant_name(name: str) -> None:
    """A tenant name is the whole string: `acme` followed by a newline is no tenant (with
    `$`, it passed, and became a tenant of its own beside `acme`)."""
    assert TENANT.match(name) is None


@pytest.mark.parametrize("name", ["acme", "a", "A.b_c-9", "a" * 64])
def test_a_tenant_name(name: str) -> None:
    assert TENANT.match(name) is not None


def test_keys_create_refuses_a_tenant_with_a_newline(
    keys_redis: None, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit, match="tenant"):
        cli.main(["keys", "create", "--tenant", "acme\n"])
    assert capsys.readouterr().out == ""  # no key printed


def test_one_limit_from_the_environment_keeps_the_other_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VA_AUTH__LIMITS__SESSIONS", "5")
    limits = GatewaySettings().auth.limits
    assert (limits.sessions, limits.sessions_per_minute, limits.requests_per_minute) == (5, 60, 600)
    assert limits.audio_seconds_per_day == 36_000
