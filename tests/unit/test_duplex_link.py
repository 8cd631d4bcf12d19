"""How the gateway reads the duplex service's refusals (services/gateway/duplex_link.py):
capacity and the tenant's limits keep their meaning for the client, the rest is the
service's failure (close 1011)."""

from __future__ import annotations

from websockets.datastructures import Headers

from services.common.errors import CapacityError, DuplexUnavailable, QuotaExceeded, RateLimited
from services.common.protocol.duplex import DuplexReady, TextDelta, parse_server
from services.common.protocol.events import ErrorEvent
from services.gateway.duplex_link import _error, _refused


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
