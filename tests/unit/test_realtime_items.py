"""`conversation.item.truncate` and `conversation.item.retrieve` on `/v1/realtime`'s codec:
the events the official SDK types (openai-agents sends both on every barge-in and
transcription), and OpenAI's errors for an item the conversation does not hold."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.beta.realtime import RealtimeServerEvent as BetaServerEvent
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from services.common.protocol.events import (
    ResponseCreated,
    ResponseDone,
    ResponseFunctionCall,
    SpeechStarted,
    SpeechStopped,
    TranscriptFinal,
)
from services.common.service.ws import Frame
from services.gateway import realtime_events as rt
from services.gateway.realtime import ITEMS_KEPT, RealtimeCodec

GA_EVENTS: TypeAdapter[RealtimeServerEvent] = TypeAdapter(RealtimeServerEvent)
BETA_EVENTS: TypeAdapter[BetaServerEvent] = TypeAdapter(BetaServerEvent)


def _ask(codec: RealtimeCodec, event: dict[str, Any]) -> list[dict[str, Any]]:
    """What the codec answers a client event with: its replies, or its error event."""
    try:
        replies = codec.decode(Frame(text=json.dumps({**event, "event_id": "evt_1"}))).replies
    except rt.RealtimeError as exc:
        replies = codec.encode_error(exc, fatal=False, answering=True)
    sent = [json.loads(r) for r in replies]
    schema = BETA_EVENTS if codec.beta else GA_EVENTS
    for event_sent in sent:
        schema.validate_python(event_sent)  # as the SDK types it
    return sent


def _text_item(codec: RealtimeCodec, text: str) -> str:
    content = [{"type": "input_text", "text": text}]
    item = {"type": "message", "role": "user", "content": content}
    (created,) = _ask(codec, {"type": "conversation.item.create", "item": item})
    return str(created["item"]["id"])


def _retrieve(codec: RealtimeCodec, item_id: str) -> dict[str, Any]:
    (answer,) = _ask(codec, {"type": "conversation.item.retrieve", "item_id": item_id})
    return answer


def _truncate(codec: RealtimeCodec, item_id: str, end_ms: int = 640) -> dict[str, Any]:
    event = {"type": "conversation.item.truncate", "item_id": item_id}
    (answer,) = _ask(codec, {**event, "content_index": 0, "audio_end_ms": end_ms})
    return answer


@pytest.mark.parametrize("beta", [False, True], ids=["ga", "beta"])
def test_an_item_is_retrieved_as_the_client_was_last_told_of_it(beta: bool) -> None:
    codec = RealtimeCodec(beta=beta)
    text_id = _text_item(codec, "my name is Bob")
    codec.encode(SpeechStarted(utterance_id="utt_1", audio_start_ms=0))
    codec.encode(SpeechStopped(utterance_id="utt_1", audio_end_ms=900))
    heard = TranscriptFinal(utterance_id="utt_1", text="hello", audio_start_ms=0, audio_end_ms=900)
    codec.encode(heard)
    codec.encode(ResponseCreated(response_id="resp_1", utterance_id="utt_1"))
    assert _retrieve(codec, "item_1")["item"]["status"] == "in_progress"
    call = ResponseFunctionCall(response_id="resp_1", call_id="call_1", name="f", arguments="{}")
    call_id = json.loads(codec.encode(call)[0])["item"]["id"]
    codec.encode(ResponseDone(response_id="resp_1", status="cancelled", text="Hi Bob"))

    assert _retrieve(codec, text_id)["item"]["content"] == [
        {"type": "input_text", "text": "my name is Bob"}
    ]
    voice = _retrieve(codec, "utt_1")
    assert voice["type"] == "conversation.item.retrieved"
    assert voice["item"]["content"] == [{"type": "input_audio", "transcript": "hello"}]
    answer = _retrieve(codec, "item_1")["item"]
    part = "audio" if beta else "output_audio"
    assert (answer["status"], answer["content"]) == (
        "incomplete",
        [{"type": part, "transcript": "Hi Bob"}],  # what was heard of it
    )
    assert _retrieve(codec, call_id)["item"]["status"] == "completed"


@pytest.mark.parametrize("beta", [False, True], ids=["ga", "beta"])
def test_a_truncate_of_an_answer_is_acknowledged(beta: bool) -> None:
    """The server kept only what was heard already: the truncate changes nothing, and is
    answered as OpenAI answers it."""
    codec = RealtimeCodec(beta=beta)
    codec.encode(ResponseCreated(response_id="resp_1"))
    truncated = _truncate(codec, "item_1", 640)
    assert truncated.pop("event_id").startswith("event_")
    assert truncated == {
        "type": "conversation.item.truncated",
        "item_id": "item_1",
        "content_index": 0,
        "audio_end_ms": 640,
    }


def test_items_the_conversation_does_not_hold_are_openai_errors() -> None:
    codec = RealtimeCodec()
    user = _text_item(codec, "hello")
    cases = [
        (_retrieve(codec, "item_nope"), "item_retrieve_invalid_item_id", None),
        (_truncate(codec, "item_nope"), "item_truncate_invalid_item_id", None),
        (_truncate(codec, user), "invalid_value", "item_id"),  # only answers have audio
    ]
    for answer, code, param in cases:
        error = answer["error"]
        assert (error["type"], error["code"], error["param"]) == (
            "invalid_request_error",
            code,
            param,
        )
        assert error["event_id"] == "evt_1"
    assert "the item with id 'item_nope' does not exist" in cases[0][0]["error"]["message"]


def test_only_the_most_recent_items_are_kept() -> None:
    codec = RealtimeCodec()
    first = _text_item(codec, "first")
    for n in range(ITEMS_KEPT - 1):
        _text_item(codec, f"turn {n}")
    assert _retrieve(codec, first)["type"] == "conversation.item.retrieved"
    _text_item(codec, "one more")
    assert _retrieve(codec, first)["error"]["code"] == "item_retrieve_invalid_item_id"
