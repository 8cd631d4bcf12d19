"""The OpenAI Realtime client events as `/v1/stream` settings, and the shared handshake."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from starlette.websockets import WebSocket

from services.common.audio.turns import SpeechEnd, TurnSegmenter
from services.common.audio.vad import VadSettings
from services.common.auth.credentials import credential
from services.common.errors import UnsupportedSampleRate
from services.gateway import realtime_events as rt
from services.gateway.handshake import read_handshake


def _patch(session: dict[str, Any]) -> dict[str, Any]:
    event = json.dumps({"type": "session.update", "session": session})
    _, parsed = rt.parse_client_event(event)
    assert isinstance(parsed, rt.SessionUpdate)
    return rt.native_patch(parsed.session)


def test_ga_session_update_maps_onto_the_native_session() -> None:
    patch = _patch(
        {
            "type": "realtime",
            "instructions": "Be brief.",
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": 24000},
                    "transcription": {"model": "whisper-1", "language": "en"},
                    "turn_detection": {
                        "type": "server_vad",
                        "threshold": 0.6,
                        "silence_duration_ms": 400,
                    },
                },
                "output": {"voice": "alloy"},
            },
        }
    )
    assert patch == {
        "instructions": "Be brief.",
        "voice": "alloy",
        "input_format": "pcm16",
        "input_sample_rate": 24000,
        "language": "en",
        "partials": True,  # a transcription model asked for: its deltas are sent
        "turn_detection": {"type": "server_vad", "threshold": 0.6, "silence_ms": 400},
    }


def test_beta_session_and_null_turn_detection() -> None:
    patch = _patch({"voice": "verse", "input_audio_format": "pcm16", "turn_detection": None})
    assert patch == {
        "voice": "verse",
        "input_format": "pcm16",
        "input_sample_rate": 24000,
        "turn_detection": {"type": "manual"},
    }
    assert _patch({"instructions": "x"}) == {"instructions": "x"}  # absent: unchanged


@pytest.mark.parametrize(
    ("session", "given", "sent"),
    [
        ({"input_audio_format": "g711_ulaw", "output_audio_format": "g711_alaw"}, "pcmu", "pcma"),
        (
            {
                "audio": {
                    "input": {"format": {"type": "audio/pcmu"}},
                    "output": {"format": {"type": "audio/pcma"}},
                }
            },
            "pcmu",
            "pcma",
        ),
        ({"audio": {"output": {"format": {"type": "audio/pcmu", "rate": 8000}}}}, None, "pcmu"),
    ],
)
def test_g711_formats_are_8k_telephone_audio(
    session: dict[str, Any], given: str | None, sent: str
) -> None:
    patch = _patch(session)
    assert patch.get("input_format") == given
    assert patch.get("input_sample_rate") == (8000 if given else None)
    assert (patch["output_format"], patch["output_sample_rate"]) == (sent, 8000)


@pytest.mark.parametrize(
    ("session", "code"),
    [
        ({"input_audio_format": "opus"}, "invalid_value"),
        ({"input_audio_format": "audio/pcmu"}, "invalid_value"),  # a GA name where beta's go
        ({"audio": {"input": {"format": {"type": "g711_ulaw"}}}}, "invalid_value"),
        ({"audio": {"input": {"format": {"type": "audio/opus"}}}}, "invalid_value"),
        ({"audio": {"input": {"format": {"type": "audio/pcmu", "rate": 16000}}}}, None),
    ],
)
def test_formats_we_do_not_speak_are_refused(session: dict[str, Any], code: str | None) -> None:
    if code is None:
        with pytest.raises(UnsupportedSampleRate):
            _patch(session)
        return
    with pytest.raises(rt.RealtimeError) as refused:
        _patch(session)
    assert refused.value.code == code


def test_an_odd_rate_is_unsupported() -> None:
    with pytest.raises(UnsupportedSampleRate):
        _patch({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 22050}}}})


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("{", "invalid_json"),
        ('{"type": "session.update", "n": ' + "9" * 5000 + "}", "invalid_json"),
        ('{"type": "nope", "event_id": "e1"}', "invalid_value"),
        ('{"type": "conversation.item.delete", "event_id": "e1"}', "unsupported_event"),
        ('{"type": "conversation.item.truncate", "event_id": "e1"}', "invalid_value"),
        ('{"type": "conversation.item.retrieve", "event_id": "e1"}', "invalid_value"),
        ('{"type": "input_audio_buffer.append", "event_id": "e1"}', "invalid_value"),
    ],
)
def test_bad_client_events_are_openai_errors(text: str, code: str) -> None:
    with pytest.raises(rt.RealtimeError) as refused:
        rt.parse_client_event(text)
    assert refused.value.code == code
    assert refused.value.event_id == (None if code == "invalid_json" else "e1")


def _ws(headers: dict[str, str]) -> WebSocket:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    offered = [p.strip() for p in headers.get("Sec-WebSocket-Protocol", "").split(",") if p]
    scope = {
        "type": "websocket",
        "headers": raw,
        "path": "/v1/stream",
        "query_string": b"",
        "subprotocols": offered,  # as uvicorn fills it in
    }
    return WebSocket(scope, receive=None, send=None)  # type: ignore[arg-type]


def test_handshake_reads_the_credential_from_a_header_or_a_subprotocol() -> None:
    """The guard's `credential` reads it; the handshake picks the subprotocol to answer."""
    assert credential(_ws({"Authorization": "Bearer abc"}).scope) == "abc"
    ws = _ws({"Sec-WebSocket-Protocol": "voice-agent, voice-agent.token.t0k"})
    browser = read_handshake(ws)
    assert (credential(ws.scope), browser.subprotocol) == ("t0k", "voice-agent")
    ws = _ws({"Sec-WebSocket-Protocol": "realtime, openai-insecure-api-key.sk-1"})
    openai = read_handshake(ws)
    assert (credential(ws.scope), openai.subprotocol) == ("sk-1", "realtime")
    assert "realtime" in openai.offered
    ws = _ws({})
    none = read_handshake(ws)
    assert (credential(ws.scope), none.subprotocol) == (None, None)


def test_manual_turns_end_only_on_commit() -> None:
    segmenter = TurnSegmenter(VadSettings(min_silence_ms=100), auto_end=False)
    speech, silence = np.ones(512, np.float32) * 0.1, np.zeros(512, np.float32)
    events = []
    for _ in range(20):
        events += segmenter.feed(speech, [0.9])
    for _ in range(60):  # ~2 s of silence: no end, no pause
        events += segmenter.feed(silence, [0.01])
    assert [type(e).__name__ for e in events] == ["SpeechStart"]
    end = segmenter.flush()
    assert isinstance(end, SpeechEnd) and end.audio.size > 0


def test_a_tool_schema_nested_past_what_a_session_can_save_is_refused() -> None:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(299):
        schema = {"type": "object", "properties": {"x": schema}}
    tool = {"type": "function", "name": "f", "parameters": schema}
    event = {"type": "session.update", "event_id": "e1", "session": {"tools": [tool]}}
    with pytest.raises(rt.RealtimeError) as refused:
        rt.parse_client_event(json.dumps(event))
    assert refused.value.code == "invalid_value" and "nests deeper" in str(refused.value)
