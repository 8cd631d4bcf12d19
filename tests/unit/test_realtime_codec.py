"""`/v1/realtime`'s codec on its own: what it makes of client events the Session must not
see as they came (text items that would not be a valid turn, a commit that was not heard)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.common.errors import AsrUnavailable
from services.common.protocol.events import (
    InputAudioCommit,
    ResponseCreate,
    SpeechStarted,
)
from services.common.service.ws import Frame
from services.gateway import realtime_events as rt
from services.gateway.codec import UserItem
from services.gateway.realtime import RealtimeCodec


def _send(codec: RealtimeCodec, event: dict[str, Any]) -> list[Any]:
    return codec.decode(Frame(text=json.dumps(event))).inputs


def _item(*texts: str) -> dict[str, Any]:
    content = [{"type": "input_text", "text": text} for text in texts]
    return {"type": "conversation.item.create", "item": {"role": "user", "content": content}}


@pytest.mark.parametrize(
    "texts",
    [["   "], ["hi\u0000there"], ["ok", ("a" * 5000, "b" * 5000)]],
    ids=["blank", "nul", "too-long-parts"],
)
def test_a_text_item_that_would_not_be_a_turn_is_refused_by_itself(
    texts: list[str | tuple[str, str]],
) -> None:
    """Each is refused when it comes (`invalid_value`); the items before it joined the
    conversation when they came, and `response.create` answers them."""
    codec = RealtimeCodec()
    *accepted, refused = texts
    for text in accepted:
        assert isinstance(text, str)
        assert _send(codec, _item(text)) == [UserItem(text)]
    with pytest.raises(rt.RealtimeError) as error:
        _send(codec, _item(*refused) if isinstance(refused, tuple) else _item(refused))
    assert (error.value.code, error.value.param) == ("invalid_value", "item.content")
    assert _send(codec, {"type": "response.create"}) == [ResponseCreate(type="response.create")]


def test_a_commit_whose_transcript_failed_leaves_response_create_working() -> None:
    codec = RealtimeCodec()
    codec.encode(SpeechStarted(utterance_id="u1", audio_start_ms=0))
    assert _send(codec, {"type": "input_audio_buffer.commit"}) == [
        InputAudioCommit(type="input_audio.commit")
    ]
    assert _send(codec, {"type": "response.create"}) == []  # the commit's turn answers itself
    codec.encode_error(AsrUnavailable("no ASR worker answered"), fatal=False)
    assert _send(codec, {"type": "response.create"}) == [ResponseCreate(type="response.create")]
