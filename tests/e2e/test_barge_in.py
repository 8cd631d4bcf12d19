"""Barge-in over real services: the user talks over the agent and the agent stops."""

from __future__ import annotations

from services.client.stream import StreamClient
from services.common.audio.pcm import pcm16_to_float
from tests.conftest import Stack
from tests.speech import speak

LONG_REPLY = (
    "Once upon a time there was a lighthouse keeper. Every night he climbed the stairs. "
    "He lit the great lamp and watched the ships. The sea was wide and dark and cold. "
    "One night a storm came from the west. The waves were as tall as houses."
)


async def test_user_speech_stops_the_agent(lite_stack: Stack) -> None:
    async with StreamClient(lite_stack.stream_url) as client:
        turn = client.new_turn()
        await client.send({"type": "response.create", "text": LONG_REPLY})
        await client.wait_for("response.created", 10)
        # listen until the agent has been speaking for a while (however busy the machine,
        # Piper's first sentence comes when it comes): a second of its audio
        second = 2 * client.output_rate
        assert await client.silence_while(lambda: len(turn.audio) < second, 30), "no agent audio"
        audio_before = len(turn.audio)
        assert audio_before > 0, "the agent should be speaking"
        await client.speak(speak("how is the weather today", 16000), 16000, lead_silence_ms=0)
        started = await client.wait_for("speech.started", 5)
        done = await client.wait_for(
            "response.done", 10, predicate=lambda e: e["status"] == "cancelled"
        )
        client.new_turn()  # what follows (the reply to the interruption) is another turn
        await client.silence_until("transcript.final", timeout_s=15)

    clear = turn.of_type("output_audio.clear")
    assert clear and clear[0]["response_id"] == done["response_id"]
    # no audio of the cancelled response after output_audio.clear
    clear_at = turn.time_of("output_audio.clear")
    started_at = turn.time_of("speech.started")
    assert clear_at is not None and started_at is not None
    assert turn.last_audio_at is not None and turn.last_audio_at <= clear_at + 0.05
    time_to_silence_ms = (turn.last_audio_at - started_at) * 1000
    assert time_to_silence_ms < 600, time_to_silence_ms
    # what was heard is a prefix of the reply, shorter than all of it
    heard = done["text"]
    assert heard and LONG_REPLY.startswith(heard.split(" ")[0])
    assert len(heard.split()) < len(LONG_REPLY.split())
    assert " ".join(LONG_REPLY.split()[: len(heard.split())]) == heard
    assert started["utterance_id"]
    played_s = len(pcm16_to_float(bytes(turn.audio))) / client.output_rate
    assert played_s < 20
