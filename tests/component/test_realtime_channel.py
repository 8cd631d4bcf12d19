"""The Realtime codec on a session channel: native events out as OpenAI events, OpenAI events
in as typed native inputs (parsed once)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from services.common.errors import InvalidMessage
from services.common.protocol.events import (
    ConversationToolResult,
    OutputAudioClear,
    ResponseAudioDone,
    ResponseCancel,
    ResponseCreate,
    ResponseCreated,
    ResponseDone,
    ResponseFunctionCall,
    ResponseTextDelta,
    SessionConfig,
    SessionCreated,
    SpeechStarted,
    SpeechStopped,
    TranscriptFinal,
    TranscriptPartial,
)
from services.common.service.ws import Channel
from services.gateway.codec import AudioIn, SessionChannel
from services.gateway.realtime import RealtimeCodec


class FakeSocket:
    application_state = None

    def __init__(self, incoming: list[dict[str, Any]] | None = None) -> None:
        self.incoming = [json.dumps(m) for m in incoming or []]
        self.sent: list[dict[str, Any]] = []

    async def send_text(self, text: str) -> None:
        self.sent.append(json.loads(text))

    async def send_bytes(self, _: bytes) -> None:
        raise AssertionError("a realtime client never gets binary frames")

    async def receive(self) -> dict[str, Any]:
        return {"type": "websocket.receive", "text": self.incoming.pop(0)}


def _channel(beta: bool = False, incoming: list[dict[str, Any]] | None = None) -> Any:
    sock = FakeSocket(incoming)
    io = Channel(sock, "gateway", 1 << 20)  # type: ignore[arg-type]
    return SessionChannel(io, RealtimeCodec(beta=beta)), sock


def _types(sock: FakeSocket) -> list[str]:
    return [e["type"] for e in sock.sent]


async def test_a_turn_and_its_answer_in_openai_events() -> None:
    channel, sock = _channel()
    await channel.send(SessionCreated(session=SessionConfig(id="s1", input_sample_rate=24000)))
    await channel.send(SpeechStarted(utterance_id="u1", audio_start_ms=100))
    for text in ("what is", "what is the", "what was"):  # held: the item does not exist yet
        await channel.send(TranscriptPartial(utterance_id="u1", text=text))
    await channel.send(SpeechStopped(utterance_id="u1", audio_end_ms=900))
    await channel.send(
        TranscriptFinal(utterance_id="u1", text="what was", audio_start_ms=100, audio_end_ms=900)
    )
    await channel.send(ResponseCreated(response_id="resp_1", utterance_id="u1"))
    await channel.send(ResponseTextDelta(response_id="resp_1", delta="what was"))
    await channel.send_audio(b"\x01\x00" * 4)
    await channel.send(ResponseAudioDone(response_id="resp_1", audio_ms=10))
    await channel.send(ResponseDone(response_id="resp_1", status="completed", text="what was"))
    assert _types(sock) == [
        "session.created",
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.created",
        "conversation.item.input_audio_transcription.delta",  # what was heard by then
        "conversation.item.input_audio_transcription.completed",
        "response.created",
        "response.output_item.added",
        "conversation.item.created",
        "response.content_part.added",
        "response.output_audio_transcript.delta",
        "response.output_audio.delta",
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.done",
    ]
    deltas = [e["delta"] for e in sock.sent if e["type"].endswith("transcription.delta")]
    assert deltas == ["what was"]
    audio = next(e for e in sock.sent if e["type"] == "response.output_audio.delta")
    assert base64.b64decode(audio["delta"]) == b"\x01\x00" * 4
    done = sock.sent[-1]["response"]
    assert (
        done["status"] == "completed"
        and done["output"][0]["content"][0]["transcript"] == "what was"
    )
    assert all(e["event_id"].startswith("event_") for e in sock.sent)


async def test_beta_names_and_a_client_cancel() -> None:
    channel, sock = _channel(beta=True, incoming=[{"type": "response.cancel"}, {"type": "x"}])
    await channel.send(ResponseCreated(response_id="resp_2"))
    inputs = await channel.receive()  # the cancel becomes the native one; "x" is refused
    assert inputs == [ResponseCancel(type="response.cancel")]
    await channel.send_audio(b"\x00\x00")
    await channel.send(OutputAudioClear(response_id="resp_2"))
    await channel.send(ResponseDone(response_id="resp_2", status="cancelled", text="heard"))
    assert _types(sock)[-7:] == [
        "response.audio.delta",
        "output_audio_buffer.cleared",
        "response.audio.done",  # a cut response's audio part is closed too
        "response.audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.done",
    ]
    assert sock.sent[-4]["transcript"] == "heard"
    done = sock.sent[-1]["response"]
    assert done["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
    assert done["output"][0]["content"][0] == {"type": "audio", "transcript": "heard"}


@pytest.mark.parametrize("seconds", [0.02, 1.0, 2.5])
async def test_appends_become_frames_of_at_most_one_second(seconds: float) -> None:
    pcm = bytes(2 * int(24000 * seconds))
    append = {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()}
    channel, _ = _channel(incoming=[append])
    await channel.send(SessionCreated(session=SessionConfig(id="s", input_sample_rate=24000)))
    frames = await channel.receive()
    assert all(isinstance(f, AudioIn) for f in frames)
    assert b"".join(f.pcm for f in frames) == pcm
    assert max(len(f.pcm) for f in frames) <= 48000


async def test_bad_audio_is_an_error_event_and_the_next_event_is_served() -> None:
    odd = {"type": "input_audio_buffer.append", "audio": base64.b64encode(b"abc").decode()}
    incoming = [
        odd,
        {"type": "input_audio_buffer.append", "audio": "!!"},
        {"type": "response.create"},
    ]
    channel, sock = _channel(incoming=incoming)
    assert await channel.receive() == [ResponseCreate(type="response.create")]
    errors = [e["error"] for e in sock.sent if e["type"] == "error"]
    assert [e["code"] for e in errors] == ["invalid_audio", "invalid_audio"]
    assert {e["type"] for e in errors} == {"invalid_request_error"}


async def test_a_fatal_error_says_so() -> None:
    """Errors keep `fatal` on every wire format (OpenAI's clients ignore the extra field)."""
    channel, sock = _channel()
    error = InvalidMessage("going away")
    error.fatal = True
    await channel.send_error(error)
    await channel.send_error(InvalidMessage("a mistake"))
    fatal, not_fatal = (e["error"] for e in sock.sent)
    assert fatal["fatal"] is True and "fatal" not in not_fatal


async def test_tools_and_the_model_in_session_update() -> None:
    tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
    update = {
        "type": "session.update",
        "session": {
            "model": "assistant",
            "tools": [tool],
            "tool_choice": {"type": "function", "name": "get_weather"},
        },
    }
    sock = FakeSocket([update, {**update, "session": {"model": "gpt-realtime"}}])
    sock.incoming.append(
        json.dumps({"type": "session.update", "session": {"tools": [{"type": "mcp"}]}})
    )
    sock.incoming.append(
        json.dumps({"type": "session.update", "session": {"tools": [{"name": "bad name"}]}})
    )
    sock.incoming.append(json.dumps({"type": "response.create"}))
    io = Channel(sock, "gateway", 1 << 20)  # type: ignore[arg-type]
    channel = SessionChannel(io, RealtimeCodec(agents=frozenset({"echo", "assistant"})))
    (first,) = await channel.receive()
    patch = first.session
    assert patch.agent == "assistant" and patch.tools[0].name == "get_weather"
    assert patch.tool_choice.name == "get_weather"
    (second,) = await channel.receive()
    assert second.session.agent is None  # an OpenAI model name keeps the default agent
    assert await channel.receive() == [ResponseCreate(type="response.create")]
    errors = [e["error"] for e in sock.sent if e["type"] == "error"]
    assert errors[0]["code"] == "invalid_value" and "'mcp' tools" in errors[0]["message"]
    assert errors[1]["param"] == "session.tools.0.name"


async def test_a_function_call_and_its_output() -> None:
    output = {
        "type": "conversation.item.create",
        "item": {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    }
    missing = {"type": "conversation.item.create", "item": {"type": "function_call_output"}}
    channel, sock = _channel(incoming=[missing, output])
    config = SessionConfig(id="sess_1", agent="assistant")
    await channel.send(SessionCreated(session=config))
    await channel.send(ResponseCreated(response_id="resp_1"))
    await channel.send(ResponseTextDelta(response_id="resp_1", delta="Let me check."))
    await channel.send(
        ResponseFunctionCall(
            response_id="resp_1", call_id="call_1", name="get_weather", arguments='{"city":"Paris"}'
        )
    )
    await channel.send(ResponseAudioDone(response_id="resp_1", audio_ms=900))
    await channel.send(ResponseDone(response_id="resp_1", status="completed", text="Let me check."))
    kinds = _types(sock)
    start = kinds.index("response.function_call_arguments.delta") - 2
    assert kinds[start:] == [
        "response.output_item.added",
        "conversation.item.created",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.done",
    ]
    assert sock.sent[0]["session"]["model"] == "assistant"
    done = sock.sent[-1]["response"]
    assert [o["type"] for o in done["output"]] == ["message", "function_call"]
    assert done["output"][1]["call_id"] == "call_1" and done["output"][1]["status"] == "completed"
    args = sock.sent[start + 3]
    assert args["arguments"] == '{"city":"Paris"}' and args["output_index"] == 1
    (result,) = await channel.receive()
    assert result == ConversationToolResult(
        type="conversation.tool_result", call_id="call_1", output="sunny"
    )
    error = next(e for e in sock.sent if e["type"] == "error")["error"]
    assert error["code"] == "invalid_value" and error["param"] == "item.call_id"
    created = sock.sent[-1]
    assert created["type"] == "conversation.item.created"
    assert created["item"]["type"] == "function_call_output"
