"""`/v1/realtime`'s codec on its own: what it makes of client events the Session must not
see as they came (text items that would not be a valid turn, a commit that was not heard,
a response.create a committed turn answers), and the order of the events it sends."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.common.errors import AsrUnavailable
from services.common.protocol.events import (
    InputAudioCommit,
    OutputAudioClear,
    ResponseAudioDone,
    ResponseCreate,
    ResponseCreated,
    ResponseDone,
    ResponseTextDelta,
    SpeechStarted,
    SpeechStopped,
    TranscriptFinal,
    TranscriptPartial,
)
from services.common.service.ws import Frame
from services.gateway import realtime_events as rt
from services.gateway.codec import Outgoing, UserItem
from services.gateway.realtime import RealtimeCodec


def _send(codec: RealtimeCodec, event: dict[str, Any]) -> list[Any]:
    return codec.decode(Frame(text=json.dumps(event))).inputs


def _sent(out: list[Outgoing]) -> list[dict[str, Any]]:
    return [json.loads(o) for o in out]


def _types(out: list[Outgoing]) -> list[str]:
    return [e["type"] for e in _sent(out)]


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


def _speaking(codec: RealtimeCodec, text: str = "hello") -> None:
    codec.encode(ResponseCreated(response_id="resp_1"))
    codec.encode(ResponseTextDelta(response_id="resp_1", delta=text))
    codec.encode_audio(b"\x00\x00" * 4)


@pytest.mark.parametrize("beta", [False, True], ids=["ga", "beta"])
def test_a_cut_response_closes_its_audio_part_with_what_was_heard(beta: bool) -> None:
    """Cancelled (by the client or by the user's speech): the audio part's `.done` events
    come too, as OpenAI sends them, before the part, the item and the response are done."""
    codec = RealtimeCodec(beta=beta)
    _speaking(codec, "one two three four")
    assert _types(codec.encode(OutputAudioClear(response_id="resp_1"))) == [
        "output_audio_buffer.cleared"
    ]
    done = _sent(codec.encode(ResponseDone(response_id="resp_1", status="cancelled", text="one")))
    audio, transcript = (
        ("response.audio.done", "response.audio_transcript.done")
        if beta
        else ("response.output_audio.done", "response.output_audio_transcript.done")
    )
    assert [e["type"] for e in done] == [
        audio,
        transcript,
        "response.content_part.done",
        "response.output_item.done",
        "response.done",
    ]
    assert done[1]["transcript"] == "one"  # what was heard, as the item says
    assert {(e["response_id"], e["item_id"]) for e in done[:3]} == {("resp_1", "item_1")}


def test_the_audio_part_is_closed_once() -> None:
    codec = RealtimeCodec()
    _speaking(codec)
    closed = _types(codec.encode(ResponseAudioDone(response_id="resp_1", audio_ms=10)))
    assert closed == ["response.output_audio.done", "response.output_audio_transcript.done"]
    done = codec.encode(ResponseDone(response_id="resp_1", status="completed", text="hello"))
    assert _types(done) == [
        "response.content_part.done",
        "response.output_item.done",
        "response.done",
    ]


@pytest.mark.parametrize(("duplex", "passed_on"), [(False, False), (True, True)])
def test_a_response_create_after_the_vads_end_of_turn_is_that_turns_answer(
    duplex: bool, passed_on: bool
) -> None:
    """server_vad: a create between `committed` and the transcript is the turn's answer
    (it made a second response that answered an empty history). Not on the duplex backend:
    its model answers by itself, no response ever follows, and its session must refuse the
    create (`not_supported`) rather than it waiting for ever."""
    codec = RealtimeCodec(duplex=duplex)
    codec.encode(SpeechStarted(utterance_id="u1", audio_start_ms=0))
    codec.encode(SpeechStopped(utterance_id="u1", audio_end_ms=900))
    expected = [ResponseCreate(type="response.create")] if passed_on else []
    assert _send(codec, {"type": "response.create"}) == expected
    codec.encode(ResponseCreated(response_id="resp_1", utterance_id="u1"))
    codec.encode(ResponseDone(response_id="resp_1", status="completed", text="hi"))
    assert _send(codec, {"type": "response.create"}) == [ResponseCreate(type="response.create")]


@pytest.mark.parametrize("code", ["asr_unavailable", "invalid_audio"])
def test_a_vad_turn_whose_transcription_failed_leaves_response_create_working(code: str) -> None:
    """The ASR failing the turn, with its own code (audio it cannot read) or not: the
    create waiting for the transcript is answered by that error, and the next one works."""
    codec = RealtimeCodec()
    codec.encode(SpeechStarted(utterance_id="u1", audio_start_ms=0))
    codec.encode(SpeechStopped(utterance_id="u1", audio_end_ms=900))
    assert _send(codec, {"type": "response.create"}) == []  # the turn's own answer, to come
    failure = AsrUnavailable("no transcript")
    failure.code = code
    assert [e["error"]["code"] for e in _sent(codec.encode_error(failure, fatal=False))] == [code]
    assert _send(codec, {"type": "response.create"}) == [ResponseCreate(type="response.create")]


def test_a_manual_commit_on_the_duplex_backend_leaves_response_create_to_the_session() -> None:
    codec = RealtimeCodec(duplex=True)
    codec.encode(SpeechStarted(utterance_id="u1", audio_start_ms=0))
    assert _send(codec, {"type": "input_audio_buffer.commit"}) == [
        InputAudioCommit(type="input_audio.commit")
    ]
    assert _send(codec, {"type": "response.create"}) == [ResponseCreate(type="response.create")]


def test_transcription_deltas_wait_for_their_item() -> None:
    """Interim transcripts come while the user speaks, before the item exists: held (the
    latest, a revision too), and sent as what was heard once `conversation.item.created`
    is."""
    codec = RealtimeCodec()
    codec.encode(SpeechStarted(utterance_id="u1", audio_start_ms=0))
    for text in ("what is", "what is the", "what was the"):
        assert codec.encode(TranscriptPartial(utterance_id="u1", text=text)) == []
    stopped = _sent(codec.encode(SpeechStopped(utterance_id="u1", audio_end_ms=900)))
    assert [e["type"] for e in stopped] == [
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.created",
        "conversation.item.input_audio_transcription.delta",
    ]
    assert (stopped[3]["item_id"], stopped[3]["delta"]) == ("u1", "what was the")
    final = TranscriptFinal(
        utterance_id="u1", text="what was the", audio_start_ms=0, audio_end_ms=900
    )
    assert _types(codec.encode(final)) == ["conversation.item.input_audio_transcription.completed"]


def test_a_cleared_utterance_sends_no_deltas() -> None:
    codec = RealtimeCodec()
    codec.encode(SpeechStarted(utterance_id="u1", audio_start_ms=0))
    codec.encode(TranscriptPartial(utterance_id="u1", text="never mind"))
    assert _types(codec.decode(Frame(text='{"type": "input_audio_buffer.clear"}')).replies) == [
        "input_audio_buffer.cleared"
    ]
    assert codec.encode(TranscriptPartial(utterance_id="u1", text="never mind me")) == []
    codec.encode(SpeechStarted(utterance_id="u2", audio_start_ms=2000))
    codec.encode(TranscriptPartial(utterance_id="u2", text="yes"))
    stopped = _sent(codec.encode(SpeechStopped(utterance_id="u2", audio_end_ms=2500)))
    deltas = [e for e in stopped if e["type"].endswith("transcription.delta")]
    assert [(e["item_id"], e["delta"]) for e in deltas] == [("u2", "yes")]


def test_previous_item_id_is_the_item_an_item_follows_not_what_was_asked() -> None:
    """Items append, whatever `previous_item_id` a client sends ("root", an unknown id):
    `conversation.item.created` says where the item is."""
    codec = RealtimeCodec()
    created = []
    for previous in (None, "root", "item_nope"):
        event = {**_item("hi"), "previous_item_id": previous}
        created += _sent(codec.decode(Frame(text=json.dumps(event))).replies)
    ids = [e["item"]["id"] for e in created]
    assert [e["previous_item_id"] for e in created] == [None, ids[0], ids[1]]
