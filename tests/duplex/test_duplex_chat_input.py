"""`/api/chat` with sphn's own Opus (the fake engine: no model needed): bytes that are not
Ogg/Opus are the client's error (0x05, close 1007), not an exception of the server's (it
ended the socket with a bare 1006)."""

from __future__ import annotations

import pytest

from tests.conftest import RedisProc
from tests.duplex_client import duplex_server, refused_chat_audio


@pytest.mark.parametrize(
    "payload", [b"garbage" * 50, b"OggS" + bytes(200)], ids=["not-ogg", "bad-ogg-page"]
)
async def test_audio_that_is_not_opus_is_invalid_audio_and_1007(
    redis_server: RedisProc, payload: bytes
) -> None:
    with duplex_server(redis_server.settings(), engine="fake") as server:
        error, code = await refused_chat_audio(f"{server.ws}/api/chat", payload)
    assert isinstance(error, bytes) and error.startswith(b"\x05")
    assert b"Ogg/Opus" in error
    assert code == 1007
