"""What `/v1/twilio` checks before a stream's `start`: Twilio's upgrade signature
(`X-Twilio-Signature`) and the waiting room's caps, global and per address."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.gateway.settings import TwilioSettings
from services.gateway.twilio import WaitingRoom, peer_key
from services.gateway.twilio_events import signature, signed_by_twilio, signed_urls

# Twilio's published vector (its helper libraries' tests, twilio-python
# tests/unit/test_request_validator.py): auth token 12345, this URL, these POST fields.
TOKEN = "12345"
URL = "https://mycompany.com/myapp.php?foo=1&bar=2"
FIELDS = "CallSid" + "CA1234567890ABCDE" + "Caller" + "+14158675309" + "Digits" + "1234"
FIELDS += "From" + "+14158675309" + "To" + "+18005551212"  # sorted by name, no separators


def test_the_signature_is_twilios() -> None:
    assert signature(TOKEN, URL + FIELDS) == "RSOYDt4T1cUTdK1PDd93/VVr8B8="


def test_the_default_port_is_added_as_twilio_adds_it() -> None:
    with_port = signed_urls(URL)[1]
    assert with_port == "https://mycompany.com:443/myapp.php?foo=1&bar=2"
    assert signature(TOKEN, with_port + FIELDS) == "kvajT1Ptam85bY51eRf/AJRuM3w="
    http = signed_urls(URL.replace("https", "http"))[1]
    assert signature(TOKEN, http + FIELDS) == "0ZXoZLH/DfblKGATFgpif+LLRf4="


def test_a_websocket_url_is_signed_with_and_without_its_port() -> None:
    assert signed_urls("wss://voice.example.com/v1/twilio") == [
        "wss://voice.example.com/v1/twilio",
        "wss://voice.example.com:443/v1/twilio",
    ]
    assert signed_urls("wss://voice.example.com:8443/v1/twilio") == [
        "wss://voice.example.com:8443/v1/twilio",
        "wss://voice.example.com/v1/twilio",
    ]


@pytest.mark.parametrize(
    "signed", ["wss://voice.example.com/v1/twilio", "wss://voice.example.com:443/v1/twilio"]
)
def test_signed_by_twilio(signed: str) -> None:
    url = "wss://voice.example.com/v1/twilio"
    given = signature("tok", signed)
    assert signed_by_twilio("tok", url, given)
    assert signed_by_twilio("tok", url, f" {given} ")
    assert not signed_by_twilio("other", url, given)
    assert not signed_by_twilio("tok", url + "?x=1", given)
    assert not signed_by_twilio("tok", url, given[:-2])
    assert not signed_by_twilio("tok", url, "é" + given)  # not ASCII: no TypeError
    assert not signed_by_twilio("tok", url, None)
    assert not signed_by_twilio("tok", url, "")


@pytest.mark.parametrize(
    ("host", "key"),
    [
        ("203.0.113.7", "203.0.113.7"),
        ("::ffff:203.0.113.7", "203.0.113.7"),
        ("2001:db8::1", "2001:db8::/64"),
        ("2001:db8::ffff:9", "2001:db8::/64"),
        ("2001:db8:0:1::1", "2001:db8:0:1::/64"),
        (None, "unknown"),
        ("testclient", "testclient"),
    ],
)
def test_peer_key(host: str | None, key: str) -> None:
    assert peer_key(host) == key


def test_the_waiting_room_caps_each_address_and_all() -> None:
    room = WaitingRoom(limit=4, per_address=2)
    for n in range(2):
        assert room.refusal("198.51.100.1", signed=False) is None
        room.enter(f"a{n}", "198.51.100.1", signed=False)
    assert room.refusal("198.51.100.1", signed=False) == "unverified_address"
    assert room.refusal("198.51.100.2", signed=False) is None
    assert room.refusal("198.51.100.1", signed=True) is None  # Twilio's own upgrade
    room.enter("s", "198.51.100.1", signed=True)
    room.enter("b", "198.51.100.2", signed=False)
    assert len(room) == 4
    assert room.refusal("198.51.100.3", signed=True) == "unverified"
    room.leave("a0")
    room.leave("a0")  # twice (seated, then the socket ends): counted once
    room.leave("never-entered")
    assert room.refusal("198.51.100.1", signed=False) is None
    for stream in ("a1", "s", "b"):
        room.leave(stream)
    assert len(room) == 0 and not room._by_address


def test_twilio_settings() -> None:
    secret = "a-twilio-auth-token"
    signed = TwilioSettings(auth_token=secret, public_url="wss://voice.example.com/v1/twilio")
    assert signed.auth_token is not None and secret not in repr(signed)
    assert TwilioSettings().start_timeout_s <= 5
    with pytest.raises(ValidationError, match="PUBLIC_URL"):
        TwilioSettings(auth_token="t")
    for url in ("ws://voice.example.com/v1/twilio", "wss://voice.example.com", "https://x/y"):
        with pytest.raises(ValidationError):
            TwilioSettings(public_url=url)
    with pytest.raises(ValidationError):
        TwilioSettings(auth_token="", public_url="wss://voice.example.com/v1/twilio")
