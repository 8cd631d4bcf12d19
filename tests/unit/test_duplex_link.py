"""How the gateway reads the duplex service's refusals (services/gateway/duplex_link.py):
capacity and the tenant's limits keep their meaning for the client, the rest is the
service's failure (close 1011); a service that stops answering is found out."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest
from websockets.asyncio.client import ClientConnection
from websockets.datastructures import Headers

from services.common.errors import CapacityError, DuplexUnavailable, QuotaExceeded, RateLimited
from services.common.protocol.duplex import DuplexReady, TextDelta, parse_server
from services.common.protocol.events import ErrorEvent
from services.gateway.duplex_link import DuplexLink, _error, _refused


def test_the_services_fatal_errors_as_the_clients() -> None:
    full = _error(ErrorEvent(code="capacity", message="at capacity; retry after 5 s", fatal=True))
    assert isinstance(full, CapacityError) and full.close_code == 1013
    assert full.message == "at capacity; retry after 5 s"  # the retry hint goes on as it is
    assert isinstance(
        _error(ErrorEvent(code="quota_exceeded", message="q", fatal=True)), QuotaExceeded
    )
    assert type(_error(ErrorEvent(code="rate_limited", message="r", fatal=True))) is RateLimited
    failed = _error(ErrorEvent(code="internal", message="the model failed", fatal=True))
    assert isinstance(failed, DuplexUnavailable) and failed.close_code == 1011
    assert "the model failed" in failed.message


def test_a_refused_handshake_as_the_clients_error() -> None:
    limited = _refused(429, Headers({"Retry-After": "12"}))
    assert isinstance(limited, RateLimited) and limited.retry_after_s == 12
    assert isinstance(_refused(503, Headers()), CapacityError)
    for status in (401, 403):
        refused = _refused(status, Headers())
        assert isinstance(refused, DuplexUnavailable)
        assert "VA_AUTH__TOKEN_SECRET" in refused.message
    assert "HTTP 404" in _refused(404, Headers()).message


def test_the_service_messages_parse_once() -> None:
    ready = parse_server(
        '{"type":"ready","session_id":"dup_1","input_sample_rate":24000,'
        '"output_sample_rate":24000,"frame_ms":80,"engine":"fake","model":"echo"}'
    )
    assert isinstance(ready, DuplexReady) and ready.session_id == "dup_1"
    delta = parse_server('{"type":"text.delta","delta":" hi","audio_ms":160}')
    assert isinstance(delta, TextDelta) and delta.audio_ms == 160
    error = parse_server('{"type":"error","code":"capacity","message":"m","fatal":true}')
    assert isinstance(error, ErrorEvent) and error.fatal


class QuietService:
    """The link's socket to a service that takes every frame and says nothing until told."""

    def __init__(self) -> None:
        self.said: asyncio.Queue[bytes] = asyncio.Queue()

    async def send(self, message: bytes) -> None:
        pass

    async def recv(self) -> bytes:
        return await self.said.get()


FRAME = bytes(3840)
"""One model frame (80 ms) of PCM16 at 24 kHz."""
READY = DuplexReady(
    session_id="dup_1",
    input_sample_rate=24000,
    output_sample_rate=24000,
    engine="fake",
    model="echo",
)


async def test_silence_counts_only_for_audio_sent_while_the_gateway_listens() -> None:
    now = [100.0]
    service = QuietService()
    link = DuplexLink(cast(ClientConnection, service), READY, clock=lambda: now[0])
    listening = asyncio.create_task(link.receive())
    async with asyncio.timeout(10):
        while not link.listening():
            await asyncio.sleep(0)
    now[0] += 60
    assert link.silent_for() == 0  # nothing was sent: nothing is owed
    await link.send(FRAME * 2)
    now[0] += 60
    assert link.silent_for() == 0  # the model's lead-in: it says nothing for two frames
    await link.send(FRAME)
    now[0] += 2
    assert link.silent_for() == 2
    service.said.put_nowait(FRAME)
    async with asyncio.timeout(10):
        assert await listening == FRAME
    assert link.silent_for() == 0  # answered
    await link.send(FRAME * 3)
    now[0] += 5
    assert link.silent_for() == 0  # the gateway is not reading (its client holds it up)
    listening = asyncio.create_task(link.receive())
    async with asyncio.timeout(10):
        while not link.listening():
            await asyncio.sleep(0)
    now[0] += 1
    assert link.silent_for() == 1  # counted from when it listened again
    listening.cancel()


async def test_a_service_that_answers_nothing_is_unavailable() -> None:
    service = QuietService()
    link = DuplexLink(cast(ClientConnection, service), READY)
    listening = asyncio.create_task(link.receive())
    await link.send(FRAME * 3)
    try:
        with pytest.raises(DuplexUnavailable, match=r"answered nothing for 0\.05 s"):
            async with asyncio.timeout(30):
                await link.watch(0.05)
    finally:
        listening.cancel()
