"""The wire protocol models and the edge parser."""

from __future__ import annotations

import json

import pytest

from services.common.errors import InvalidMessage, UnsupportedSampleRate
from services.common.protocol.events import (
    ASR_CLIENT_EVENTS,
    CLIENT_EVENTS,
    TTS_CLIENT_EVENTS,
    AsrCommit,
    ConversationText,
    ErrorEvent,
    ResponseCreate,
    SessionConfig,
    SessionCreated,
    SessionUpdate,
    Speak,
    parse,
)


def test_every_client_message_parses() -> None:
    cases = {
        '{"type":"session.update","session":{"voice":"x"}}': SessionUpdate,
        '{"type":"conversation.text","text":"hi"}': ConversationText,
        '{"type":"response.create"}': ResponseCreate,
    }
    for text, kind in cases.items():
        assert isinstance(parse(CLIENT_EVENTS, text), kind)
    for kind in ("input_audio.commit", "input_audio.clear", "response.cancel", "session.close"):
        assert parse(CLIENT_EVENTS, json.dumps({"type": kind})).type == kind


def test_unknown_fields_are_ignored() -> None:
    message = parse(CLIENT_EVENTS, '{"type":"conversation.text","text":"hi","future":1}')
    assert isinstance(message, ConversationText) and message.text == "hi"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"type": 5}', "string `type`"),
        ('{"type":"nope"}', "unknown message type 'nope'"),
        ('{"type":"conversation.text"}', "text"),
        ('{"type":"conversation.text","text":""}', "text"),
        ('{"type":"conversation.text","text":" \\n\\t "}', "text: .*only whitespace"),
        ('{"type":"response.create","text":""}', "text: .*only whitespace"),
        ('{"type":"session.update","session":{"voice":" "}}', "session.voice"),
        ('{"type":"session.update","session":{"language":""}}', "session.language"),
        ("[" * 100_000, "nested too deeply"),
        ('{"type":"commit","x":' + "1" * 5000 + "}", "not valid JSON: .*digits"),
        ('{"type":"conversation.text","text":"hi","x":' + "[" * 100_000 + "}", "too deeply"),
    ],
)
def test_malformed_messages_are_invalid_message(text: str, match: str) -> None:
    with pytest.raises(InvalidMessage, match=match):
        parse(CLIENT_EVENTS, text)


def _nested(depth: int) -> dict[str, object]:
    schema: dict[str, object] = {"type": "string"}
    for _ in range(depth - 1):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


def test_a_tool_schema_is_bounded() -> None:
    """Pydantic parses any depth but serializes at most 256: a session keeping a deeper
    schema failed when it sent `session.updated` or was saved (1011)."""

    def update(parameters: object) -> str:
        tool = {"type": "function", "name": "f", "parameters": parameters}
        return json.dumps({"type": "session.update", "session": {"tools": [tool]}})

    parse(CLIENT_EVENTS, update(_nested(16)))  # a real schema's depth
    with pytest.raises(InvalidMessage, match="nests deeper than 32 levels"):
        parse(CLIENT_EVENTS, update(_nested(300)))
    with pytest.raises(InvalidMessage, match="longer than 32768 characters"):
        parse(CLIENT_EVENTS, update({"type": "object", "description": "x" * 40_000}))


def test_unsupported_sample_rate_has_its_own_code() -> None:
    with pytest.raises(UnsupportedSampleRate):
        parse(CLIENT_EVENTS, '{"type":"session.update","session":{"input_sample_rate":44100}}')


def test_asr_and_tts_stream_messages() -> None:
    assert isinstance(parse(ASR_CLIENT_EVENTS, '{"type":"commit"}'), AsrCommit)
    speak = parse(TTS_CLIENT_EVENTS, '{"type":"speak","id":"a","text":"hi","sample_rate":16000}')
    assert isinstance(speak, Speak) and speak.sample_rate == 16000
    with pytest.raises(UnsupportedSampleRate):
        parse(TTS_CLIENT_EVENTS, '{"type":"speak","id":"a","text":"hi","sample_rate":44100}')
    with pytest.raises(InvalidMessage):
        parse(TTS_CLIENT_EVENTS, '{"type":"speak","text":"hi"}')


@pytest.mark.parametrize(
    "text",
    [
        '{"type":"speak","id":"a","text":""}',
        '{"type":"speak","id":"a","text":"  \\n"}',
        '{"type":"cancel","id":""}',
        '{"type":"cancel","id":"' + "x" * 129 + '"}',
    ],
    ids=["empty-text", "blank-text", "cancel-empty-id", "cancel-long-id"],
)
def test_tts_messages_that_say_nothing_are_invalid(text: str) -> None:
    with pytest.raises(InvalidMessage):
        parse(TTS_CLIENT_EVENTS, text)


def test_server_events_serialize_per_contract() -> None:
    created = json.loads(SessionCreated(session=SessionConfig(id="s")).dump())
    assert created == {
        "type": "session.created",
        "session": {
            "id": "s",
            "input_sample_rate": 16000,
            "output_sample_rate": 24000,
            "input_format": "pcm16",
            "output_format": "pcm16",
            "voice": "default",
            "language": "en",
            "agent": "echo",
            "partials": False,
        },
    }
    error = json.loads(ErrorEvent(code="invalid_audio", message="m").dump())
    assert error == {"type": "error", "code": "invalid_audio", "message": "m", "fatal": False}


def test_g711_formats_bring_their_8k_rate() -> None:
    update = parse(
        CLIENT_EVENTS,
        '{"type":"session.update","session":{"input_format":"pcmu","output_format":"pcma"}}',
    )
    assert isinstance(update, SessionUpdate)
    patch = update.session.model_dump(exclude_none=True)
    assert patch == {
        "input_format": "pcmu",
        "input_sample_rate": 8000,
        "output_format": "pcma",
        "output_sample_rate": 8000,
    }
    config = SessionConfig(id="s").patched(patch)
    assert (config.input_format, config.input_sample_rate) == ("pcmu", 8000)
    with pytest.raises(InvalidMessage, match="8 kHz only"):
        parse(
            CLIENT_EVENTS,
            '{"type":"session.update","session":{"input_format":"pcmu","input_sample_rate":16000}}',
        )
    with pytest.raises(InvalidMessage, match="8 kHz only"):
        config.patched({"input_sample_rate": 16000})  # the format stays G.711: refused
    back = config.patched({"input_format": "pcm16", "input_sample_rate": 16000})
    assert (back.input_format, back.input_sample_rate) == ("pcm16", 16000)
