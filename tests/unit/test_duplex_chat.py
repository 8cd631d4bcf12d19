"""`/api/chat` (Moshi's protocol) over a real server with the fake engine, its Opus codec
replaced by one that refuses every page (sphn is not in .venv; tests/duplex has the real
one): audio that is not Ogg/Opus is the client's error, not the server's."""

from __future__ import annotations

import types
from typing import Any

import httpx
import numpy as np
import pytest

from services.duplex import moshi_chat
from tests.conftest import RedisProc
from tests.duplex_client import duplex_server, refused_chat_audio


class RefusingOpus:
    """sphn's Opus stream reader and writer, as they meet a page that is not Ogg."""

    def __init__(self, sample_rate: int) -> None:
        self.sample_rate = sample_rate

    def append_bytes(self, data: bytes) -> np.ndarray[Any, Any]:
        raise ValueError("unexpected ogg capture pattern [0, 0, 0, 0]")

    def append_pcm(self, pcm: np.ndarray[Any, Any]) -> bytes:
        return b""


async def test_audio_that_is_not_opus_is_invalid_audio_and_1007(
    redis_server: RedisProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    codec = types.SimpleNamespace(OpusStreamReader=RefusingOpus, OpusStreamWriter=RefusingOpus)
    monkeypatch.setattr(moshi_chat, "_sphn", lambda: codec)
    with duplex_server(redis_server.settings(), engine="fake", max_sessions=1) as server:
        error, code = await refused_chat_audio(f"{server.ws}/api/chat", b"garbage" * 50)
        assert isinstance(error, bytes) and error.startswith(b"\x05")
        assert b"Ogg/Opus" in error
        assert code == 1007
        health = httpx.get(f"{server.http}/health", timeout=10).json()
        assert health["sessions"] == 0
