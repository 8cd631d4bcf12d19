"""`/v1/realtime` over the real Session (fake bus, virtual time): what the OpenAI Realtime
API promises a client about responses, items, errors and formats."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from services.common.errors import AgentFailed
from services.common.protocol.events import SessionConfig
from services.gateway.agent import AGENTS, Turn
from services.gateway.realtime import RealtimeCodec
from services.gateway.settings import GatewaySection
from services.gateway.turn_end import TrailingWordHeuristic
from tests.component.session_harness import Harness, on_virtual_time, running_session, silence, tone
from tests.component.test_prepared_reply import Recording

CONFIG = SessionConfig(id="sess_rt", input_sample_rate=16000, output_sample_rate=16000)
PUSH_TO_TALK = CONFIG.model_copy(update={"turn_detection": None})
SERVER_EVENTS: TypeAdapter[RealtimeServerEvent] = TypeAdapter(RealtimeServerEvent)


def _text_item(text: str, event_id: str | None = None) -> dict[str, Any]:
    content = [{"type": "input_text", "text": text}]
    item = {"type": "message", "role": "user", "content": content}
    return {"type": "conversation.item.create", "item": item, "event_id": event_id}


def _errors(h: Harness) -> list[dict[str, Any]]:
    return [e["error"] for e in h.of_type("error")]


def recording(calls: list[list[Turn]]) -> dict[str, Any]:
    """An agent that says a long sentence (seconds of audio) and records what it was asked."""
    long = "Here is a long answer with many words that takes seconds to say."
    return {**AGENTS, "echo": lambda: Recording(calls, long)}


@on_virtual_time
async def test_a_text_turn_during_an_answer_comes_after_what_was_heard_of_it() -> None:
    """`conversation.text` on /v1/stream while the agent speaks: the answer is cut, and what
    the user heard of it goes in the history before the new words (it went after, so the
    LLM was asked to answer its own cut-off turn)."""
    calls: list[list[Turn]] = []
    async with running_session(agents=recording(calls)) as h:
        await h.send({"type": "conversation.text", "text": "tell me a story"})
        await h.wait_for("response.created")
        await asyncio.sleep(1.5)  # it is speaking
        await h.send({"type": "conversation.text", "text": "what time is it"})
        await h.wait_for("response.done", 2)
    roles = [(t.role, t.text[:9]) for t in calls[1]]
    assert roles == [("user", "tell me a"), ("agent", "Here is a"), ("user", "what time")]


@on_virtual_time
async def test_a_text_item_joins_the_conversation_when_it_is_created() -> None:
    """A client adds context as a text item, then speaks: the voice turn's answer sees it."""
    calls: list[list[Turn]] = []
    async with running_session(
        codec=RealtimeCodec(),
        config=CONFIG,
        transcripts=["what is my name"],
        agents=recording(calls),
    ) as h:
        await h.send(_text_item("My name is Bob."))
        await h.wait_for("conversation.item.created")
        await h.say(silence(200), tone(900), silence(1000))
        await h.wait_for("response.done")
    assert calls[-1] == [Turn("user", "My name is Bob."), Turn("user", "what is my name")]


@on_virtual_time
async def test_push_to_talk_with_no_words_heard_answers_the_create_with_an_error() -> None:
    """turn_detection null: commit, then response.create. The ASR hears no words: the
    create is answered by an error naming it, never by silence."""
    async with running_session(codec=RealtimeCodec(), config=PUSH_TO_TALK, transcripts=[""]) as h:
        await h.say(silence(200), tone(600), silence(200))
        await h.send({"type": "input_audio_buffer.commit", "event_id": "evt_commit"})
        await h.send({"type": "response.create", "event_id": "evt_create"})
        await h.wait_for("error")
        completed = await h.wait_for("conversation.item.input_audio_transcription.completed")
    assert completed["transcript"] == ""
    assert completed["usage"]["type"] == "duration" and completed["usage"]["seconds"] > 0
    assert [(e["code"], e["event_id"]) for e in _errors(h)] == [
        ("input_audio_buffer_commit_empty", "evt_create")
    ]
    assert h.of_type("response.created") == []


@on_virtual_time
async def test_a_response_create_before_a_vad_turns_transcript_is_that_turns_answer() -> None:
    """server_vad, and a client that asks for the answer once `committed` comes: one
    response, to the user's words (a second one answered an empty history, and was cut
    60 ms later by the turn's own)."""
    calls: list[list[Turn]] = []
    async with running_session(
        codec=RealtimeCodec(),
        config=CONFIG,
        transcripts=["what time is it"],
        agents=recording(calls),
        asr_delay_s=0.6,
    ) as h:
        speaking = asyncio.create_task(h.say(silence(200), tone(900), silence(3000)))
        await h.wait_for("input_audio_buffer.committed")
        await h.send({"type": "response.create", "event_id": "evt_create"})
        done = (await h.wait_for("response.done"))["response"]
        await speaking
        await asyncio.sleep(2)
    assert calls == [[Turn("user", "what time is it")]]
    assert (done["status"], len(h.of_type("response.created"))) == ("completed", 1)
    assert _errors(h) == []


@on_virtual_time
async def test_a_barge_in_closes_the_audio_part_and_the_sdks_truncate_and_retrieve_work() -> None:
    """The user speaks over the answer: its audio part is closed (once, with what was
    heard) before the response is done; then what openai-agents sends on a barge-in
    (truncate the answer it played) and after a transcription (retrieve the user's item)
    is answered, in the SDK's types."""
    async with running_session(
        codec=RealtimeCodec(), config=CONFIG, transcripts=["stop"], agents=recording([])
    ) as h:
        await h.send(_text_item("tell me a story"))
        await h.send({"type": "response.create"})
        await h.wait_for("response.output_audio.delta", 5)
        await asyncio.sleep(1.0)
        await h.say(silence(100), tone(900), silence(1000))
        cut = (await h.wait_for("response.done"))["response"]
        answer = cut["output"][0]["id"]
        await h.send(
            {
                "type": "conversation.item.truncate",
                "item_id": answer,
                "audio_end_ms": 1200,
                "content_index": 0,
            }
        )
        heard = await h.wait_for("conversation.item.input_audio_transcription.completed")
        await h.send({"type": "conversation.item.retrieve", "item_id": heard["item_id"]})
        retrieved = await h.wait_for("conversation.item.retrieved")
        truncated = h.of_type("conversation.item.truncated")[0]
        await h.wait_for("response.done", 2)
    closing = [
        "output_audio_buffer.cleared",
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.done",
    ]
    kinds = [e["type"] for _, e in h.socket.events if e["type"] in closing]
    assert kinds[:6] == closing  # the cut response's; the answer to "stop" follows
    assert kinds[6:] == closing[1:]  # one audio part closed per response
    assert (cut["status"], cut["status_details"]["reason"]) == ("cancelled", "turn_detected")
    said = h.of_type("response.output_audio_transcript.done")[0]["transcript"]
    assert said == cut["output"][0]["content"][0]["transcript"]
    assert 0 < len(said) < len("Here is a long answer with many words that takes seconds to say.")
    assert (truncated["item_id"], truncated["audio_end_ms"]) == (answer, 1200)
    assert retrieved["item"]["content"] == [{"type": "input_audio", "transcript": "stop"}]
    for event in (truncated, retrieved, *h.of_type("response.output_audio.done")):
        SERVER_EVENTS.validate_python(event)
    assert _errors(h) == []


class Failing:
    name = "failing"
    prepare_safe = True

    async def respond(
        self, history: list[Turn], instructions: str | None = None
    ) -> AsyncIterator[str]:
        raise AgentFailed("the LLM answered 503: overloaded")
        yield ""


@on_virtual_time
async def test_an_error_carries_the_event_id_of_the_event_it_answers_and_no_other() -> None:
    agents: dict[str, Any] = {**AGENTS, "echo": Failing}
    async with running_session(codec=RealtimeCodec(), config=CONFIG, agents=agents) as h:
        await h.send(_text_item("hello", "evt_item"))
        await h.send({"type": "response.create", "event_id": "evt_create"})
        await h.send({"type": "input_audio_buffer.append", "audio": "", "event_id": "evt_later"})
        await h.wait_for("error", 2)
        await h.send({"type": "response.cancel", "event_id": "evt_cancel"})
        await h.wait_for("error", 3)
    by_code = {(e["code"], e["event_id"]) for e in _errors(h)}
    # the agent's failure happened meanwhile: no event of the client's caused it
    assert by_code == {
        ("agent_failed", None),
        ("invalid_audio", "evt_later"),
        ("response_cancel_not_active", "evt_cancel"),
    }


@on_virtual_time
async def test_one_response_at_a_time_and_a_cancel_names_the_one_under_way() -> None:
    async with running_session(codec=RealtimeCodec(), config=CONFIG) as h:
        await h.send(_text_item("one two three four five six"))
        await h.send({"type": "response.create"})
        first = (await h.wait_for("response.created"))["response"]["id"]
        await h.send({"type": "response.create", "event_id": "evt_second"})
        await h.send({"type": "response.cancel", "response_id": "resp_old", "event_id": "evt_c"})
        await h.wait_for("error", 2)
        await h.send({"type": "response.cancel", "response_id": first})
        done = (await h.wait_for("response.done"))["response"]
    assert [(e["type"], e["code"], e["event_id"]) for e in _errors(h)] == [
        ("invalid_request_error", "conversation_already_has_active_response", "evt_second"),
        ("invalid_request_error", "response_cancel_not_active", "evt_c"),
    ]
    assert (done["id"], done["status"]) == (first, "cancelled")
    assert len(h.of_type("response.created")) == 1


@on_virtual_time
async def test_an_output_for_a_call_never_made_is_refused_before_any_item_is_created() -> None:
    async with running_session(codec=RealtimeCodec(), config=CONFIG) as h:
        item = {"type": "function_call_output", "call_id": "call_nope", "output": "{}"}
        await h.send({"type": "conversation.item.create", "item": item, "event_id": "evt_out"})
        await h.wait_for("error")
    assert [(e["code"], e["param"], e["event_id"]) for e in _errors(h)] == [
        ("invalid_value", "item.call_id", "evt_out")
    ]
    assert h.of_type("conversation.item.created") == []


@on_virtual_time
async def test_an_output_format_asked_for_during_a_response_applies_from_the_next() -> None:
    """The reply under way keeps the coding it began with (its audio is made at its rate):
    switching it mid-way sent 16 kHz PCM16 as mu-law, at half speed and an octave down."""
    async with running_session(codec=RealtimeCodec(), config=CONFIG) as h:
        await h.send(_text_item("one two three four five six"))
        await h.send({"type": "response.create"})
        await h.wait_for("response.output_audio.delta")
        update = {"output_audio_format": "g711_ulaw"}
        await h.send({"type": "session.update", "session": update})
        await h.wait_for("session.updated")
        await h.wait_for("response.done")
        first = _delta_bytes(h, since=0)
        await h.send(_text_item("seven eight"))
        await h.send({"type": "response.create"})
        mark = len(h.socket.events)
        await h.wait_for("response.done", 2)
        second = _delta_bytes(h, since=mark)
    # the first reply: 6 words x 400 ms at 16 kHz, PCM16 to its end; the second: mu-law at
    # its own rate (8 kHz), one byte a sample
    assert len(first) == 2 * 6 * 400 * 16
    assert len(second) == 2 * 400 * 8


def _delta_bytes(h: Harness, since: int) -> bytes:
    deltas = [e for _, e in h.socket.events[since:] if e["type"] == "response.output_audio.delta"]
    return b"".join(base64.b64decode(e["delta"]) for e in deltas)


def _holding() -> TrailingWordHeuristic:
    """Holds a turn that ends mid-thought ("bread and") for 700 ms."""
    return TrailingWordHeuristic(GatewaySection(end_of_turn_hold_ms=700))


@on_virtual_time
async def test_a_held_turn_the_client_cleared_the_rest_of_is_answered() -> None:
    """ "bread and" is held; the user speaks again inside the hold (its timer stops), then
    the client clears that speech: the held turn is answered, and a create then is not
    swallowed waiting for a transcript that will never come."""
    async with running_session(
        codec=RealtimeCodec(), config=CONFIG, end_of_turn=_holding(), transcripts=["bread and"]
    ) as h:
        await h.say(silence(200), tone(600), silence(800))
        await h.wait_for("conversation.item.input_audio_transcription.completed")
        await h.say(tone(400), silence(100))  # goes on inside the hold
        await h.send({"type": "input_audio_buffer.clear", "event_id": "evt_clear"})
        await h.say(silence(1500))
        done = await h.wait_for("response.done")
        await h.send({"type": "response.create", "event_id": "evt_create"})
        await h.wait_for("response.done", 2)
    assert done["response"]["status"] == "completed"
    assert _errors(h) == []


@on_virtual_time
async def test_a_held_turn_with_words_is_answered_whatever_a_noise_after_it_holds() -> None:
    """A create absorbed by a held turn ("bread and"), then a noise inside the hold (an
    empty transcript): the held words are answered, and the create gets no error saying
    there was nothing to answer."""
    async with running_session(
        codec=RealtimeCodec(),
        config=CONFIG,
        end_of_turn=_holding(),
        transcripts=["bread and", ""],
    ) as h:
        await h.say(silence(200), tone(600), silence(800))
        await h.wait_for("conversation.item.input_audio_transcription.completed")
        await h.send({"type": "response.create", "event_id": "evt_create"})
        await h.say(tone(400), silence(900))
        await h.wait_for("response.done")
        await asyncio.sleep(3)
    assert _errors(h) == [] and len(h.of_type("response.created")) == 1


@on_virtual_time
async def test_a_bad_frame_without_an_event_id_does_not_free_the_turns_create() -> None:
    """A refused append with no event_id is the client's mistake, not the turn's failed
    transcription: the create after it is still the turn's answer (one response)."""
    calls: list[list[Turn]] = []
    async with running_session(
        codec=RealtimeCodec(),
        config=CONFIG,
        transcripts=["what time is it"],
        agents=recording(calls),
        asr_delay_s=0.6,
    ) as h:
        speaking = asyncio.create_task(h.say(silence(200), tone(900), silence(3000)))
        await h.wait_for("input_audio_buffer.committed")
        await h.send({"type": "input_audio_buffer.append", "audio": "!!notbase64"})
        await h.wait_for("error")
        await h.send({"type": "response.create", "event_id": "evt_create"})
        await speaking
        await asyncio.sleep(3)
    assert [e["response"]["status"] for e in h.of_type("response.done")] == ["completed"]
    assert calls == [[Turn("user", "what time is it")]]
