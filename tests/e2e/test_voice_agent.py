"""End to end on the lite stack: speak → VAD → ASR over Redis → echo agent → TTS → audio back."""

from __future__ import annotations

import numpy as np
import pytest

from services.client.stream import StreamClient
from services.common.audio.pcm import pcm16_to_float
from tests.conftest import Stack
from tests.e2e.wire import recall
from tests.speech import speak, transcribed

# Whisper tiny.en hears these espeak-ng sentences well (test_real_speech.py measures it); the
# pipeline, not the embedded recognizer's accuracy, is what is under test here.
SENTENCES = [
    "what is the weather like in paris today",
    "tell me a story about the sea",
]


@pytest.mark.parametrize("sentence", SENTENCES)
async def test_spoken_turn_round_trip(lite_stack: Stack, sentence: str) -> None:
    async with StreamClient(lite_stack.stream_url) as client:
        turn = client.new_turn()
        await client.speak(speak(sentence, 16000), 16000)
        done = await client.silence_until("response.done", timeout_s=20)

    finals = turn.of_type("transcript.final")
    assert len(finals) == 1, turn.events
    heard = finals[0]["text"]
    assert recall(sentence, heard) >= 0.6, heard
    assert turn.of_type("speech.started") and turn.of_type("speech.stopped")
    assert done["status"] == "completed"
    assert done["text"] == heard
    created_at = turn.time_of("response.created")
    assert created_at is not None and turn.first_audio_at is not None
    assert created_at <= turn.first_audio_at <= (turn.time_of("response.audio.done") or 0)
    audio_done = turn.of_type("response.audio.done")[0]
    assert abs(audio_done["audio_ms"] - len(turn.audio) / 2 / 24) <= 1

    # The agent's reply, transcribed again, says the same words.
    reply = pcm16_to_float(bytes(turn.audio))
    assert reply.size > 24000 * 0.5
    again = transcribed(lite_stack.asr.http, reply, 24000)
    assert recall(heard, again) >= 0.5, again


async def test_conversation_text_and_response_create(lite_stack: Stack) -> None:
    async with StreamClient(lite_stack.stream_url) as client:
        turn = client.new_turn()
        await client.send({"type": "conversation.text", "text": "Hello there. How are you?"})
        done = await client.wait_for("response.done", 20)
        assert done["status"] == "completed"
        assert done["text"] == "Hello there. How are you?"
        deltas = "".join(e["delta"] for e in turn.of_type("response.text.delta"))
        assert deltas == "Hello there. How are you?"
        assert len(turn.audio) > 0

        turn = client.new_turn()
        await client.send({"type": "response.create", "text": "Exactly this."})
        done = await client.wait_for("response.done", 20)
        assert done["text"] == "Exactly this." and len(turn.audio) > 0


async def test_output_rate_follows_session(lite_stack: Stack) -> None:
    async with StreamClient(lite_stack.stream_url) as client:
        await client.send({"type": "session.update", "session": {"output_sample_rate": 8000}})
        updated = await client.wait_for("session.updated")
        assert updated["session"]["output_sample_rate"] == 8000
        client.session = updated["session"]
        turn = client.new_turn()
        await client.send({"type": "response.create", "text": "One two three four five."})
        await client.wait_for("response.done", 20)
        audio_ms = turn.of_type("response.audio.done")[0]["audio_ms"]
        assert abs(audio_ms - len(turn.audio) / 2 / 8) <= 1
        assert audio_ms > 500
        samples = pcm16_to_float(bytes(turn.audio))
        assert float(np.abs(samples).max()) > 0.05
