"""Several gateways share one Redis; results reach the gateway that owns the session."""

from __future__ import annotations

import asyncio
from pathlib import Path

from services.client.stream import StreamClient, talk, write_wav
from services.common.audio.pcm import float_to_pcm16
from services.gateway.app import create_app
from services.gateway.settings import GatewaySettings
from tests.conftest import Stack
from tests.servers import ServerThread
from tests.speech import speak


async def test_two_gateways_each_get_their_own_results(lite_stack: Stack) -> None:
    with ServerThread(create_app(GatewaySettings(redis=lite_stack.redis))) as second:
        urls = [lite_stack.stream_url, f"{second.ws}/v1/stream"]

        async def converse(url: str, text: str) -> dict[str, object]:
            async with StreamClient(url) as client:
                turn = client.new_turn()
                await client.send({"type": "conversation.text", "text": text})
                done = await client.wait_for("response.done", 20)
                assert len(turn.audio) > 0
                return done

        texts = [f"Message number {i}." for i in range(6)]
        dones = await asyncio.gather(*(converse(urls[i % 2], text) for i, text in enumerate(texts)))
    assert [d["text"] for d in dones] == texts
    assert all(d["status"] == "completed" for d in dones)


async def test_cli_client_talks_and_saves_the_reply(lite_stack: Stack, tmp_path: Path) -> None:
    question = tmp_path / "question.wav"
    write_wav(question, float_to_pcm16(speak("how is the weather today", 22050)), 22050)
    reply = tmp_path / "reply.wav"
    received = await talk(lite_stack.stream_url, question, reply, timeout_s=20)
    assert reply.stat().st_size > 44 + 24000  # a header and at least half a second
    assert received.of_type("transcript.final")
    assert received.voice_to_voice_ms is not None and received.voice_to_voice_ms > 0
