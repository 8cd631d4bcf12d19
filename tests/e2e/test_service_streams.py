"""The services' own streams end to end: /v1/stream/asr and /v1/stream/tts (docs/protocol.md)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator
from functools import cache

import httpx
import numpy as np
import numpy.typing as npt
import pytest
import websockets.asyncio.client
from websockets.asyncio.client import ClientConnection

from services.common.audio.pcm import pcm16_to_float
from tests.conftest import Stack
from tests.e2e.wire import Json, connect, recall, recv_json, recv_until, send_json
from tests.speech import speak, to_pcm16

SENTENCE = "what is the weather like in paris today"
LONG = f"{SENTENCE}, {SENTENCE}"  # ~5 s, one segment: the comma is a short pause
LEAD_MS = 500


@cache
def _speech(text: str, rate: int) -> npt.NDArray[np.float32]:
    return speak(text, rate)


def _asr_url(stack: Stack, rate: int, partials: bool = True) -> str:
    return f"{stack.asr.ws}/v1/stream/asr?sample_rate={rate}&partials={str(partials).lower()}"


async def _send_audio(
    ws: ClientConnection, audio: npt.NDArray[np.float32], rate: int, pace: float = 0.0
) -> None:
    """Send 20 ms frames; `pace` > 0 sends at that multiple of real time, 0 as fast as possible."""
    step = rate // 50
    pcm = to_pcm16(audio)
    start = time.monotonic()
    for i, offset in enumerate(range(0, audio.size, step)):
        await ws.send(pcm[2 * offset : 2 * (offset + step)])
        if pace:
            delay = start + (i + 1) * 0.02 / pace - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)


def _silence(ms: int, rate: int) -> npt.NDArray[np.float32]:
    return np.zeros(rate * ms // 1000, np.float32)


# ---------------------------------------------------------------- ASR stream


@pytest.mark.parametrize("rate", [16000, 48000])
async def test_asr_stream_finds_and_transcribes_an_utterance(lite_stack: Stack, rate: int) -> None:
    speech = _speech(SENTENCE, rate)
    speech_ms = round(speech.size * 1000 / rate)
    async with connect(_asr_url(lite_stack, rate, partials=False)) as ws:
        assert await recv_json(ws) == {"type": "ready", "sample_rate": rate}
        await _send_audio(ws, np.concatenate([_silence(LEAD_MS, rate), speech]), rate)
        # Silence after speech ends the segment by itself (no commit).
        await _send_audio(ws, _silence(1500, rate), rate)
        final, before, _ = await recv_until(ws, "transcript.final", timeout_s=20)
    assert [e["type"] for e in before] == ["speech.started"], before
    started = before[0]
    assert final["segment_id"] == started["segment_id"]
    assert recall(SENTENCE, final["text"]) >= 0.6, final
    # Placed on the stream's timeline: onset near the end of the lead silence, end near the
    # end of the speech (VAD windows are 32 ms; espeak starts and ends with a little silence).
    assert LEAD_MS - 100 <= started["start_ms"] <= LEAD_MS + 250, started
    assert final["start_ms"] == started["start_ms"]
    assert LEAD_MS + speech_ms - 400 <= final["end_ms"] <= LEAD_MS + speech_ms + 200, (
        final,
        speech_ms,
    )


async def test_asr_stream_commit_finalizes_buffered_speech(lite_stack: Stack) -> None:
    speech = _speech(SENTENCE, 16000)
    speech_ms = round(speech.size * 1000 / 16000)
    async with connect(_asr_url(lite_stack, 16000, partials=False)) as ws:
        assert (await recv_json(ws))["type"] == "ready"
        await _send_audio(ws, np.concatenate([_silence(LEAD_MS, 16000), speech]), 16000)
        await send_json(ws, {"type": "commit"})
        final, before, _ = await recv_until(ws, "transcript.final", timeout_s=20)
        assert recall(SENTENCE, final["text"]) >= 0.6, final
        assert [e["type"] for e in before] == ["speech.started"]
        assert final["end_ms"] <= LEAD_MS + speech_ms + 50
        assert final["end_ms"] - final["start_ms"] >= speech_ms - 600
        # A commit with nothing buffered is answered by an empty final; the stream goes on.
        await send_json(ws, {"type": "commit"})
        await send_json(ws, {"type": "close"})
        rest: list[Json] = []
        async for message in ws:
            if isinstance(message, str):
                rest.append(json.loads(message))
    assert [(e["type"], e["text"], e["start_ms"] == e["end_ms"]) for e in rest] == [
        ("transcript.final", "", True)
    ]
    assert rest[0]["segment_id"] != final["segment_id"]
    assert ws.close_code == 1000


async def test_asr_stream_close_finalizes_then_closes_1000(lite_stack: Stack) -> None:
    async with connect(_asr_url(lite_stack, 16000, partials=False)) as ws:
        assert (await recv_json(ws))["type"] == "ready"
        await _send_audio(
            ws, np.concatenate([_silence(LEAD_MS, 16000), _speech(SENTENCE, 16000)]), 16000
        )
        await send_json(ws, {"type": "close"})
        final, _, _ = await recv_until(ws, "transcript.final", timeout_s=20)
        assert recall(SENTENCE, final["text"]) >= 0.6, final
        await ws.wait_closed()
    assert ws.close_code == 1000


def _voiced(audio: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """The clip without its quiet ends (a synthesizer adds a few hundred ms of silence)."""
    loud = np.flatnonzero(np.abs(audio) > 0.01)
    return audio[loud[0] : loud[-1] + 1]


async def _long_utterance(stack: Stack, partials: bool) -> tuple[list[Json], Json]:
    """One utterance, committed. With partials, the speech goes on (the sentence again, at
    real time) until the first partial has come: how many come while a fixed stretch of
    audio is sent measures the machine (none on a loaded one), not the stream."""
    rate = 16000
    events: list[Json] = []
    async with connect(_asr_url(stack, rate, partials)) as ws:
        assert (await recv_json(ws))["type"] == "ready"

        async def read() -> Json:
            while True:
                event = await recv_json(ws)
                if event["type"] == "transcript.final":
                    return event
                events.append(event)

        reader = asyncio.create_task(read())
        speech = np.concatenate([_silence(300, rate), _speech(LONG, rate)])
        await _send_audio(ws, speech, rate, pace=3.0)
        if partials:
            async with asyncio.timeout(60):
                while not any(e["type"] == "transcript.partial" for e in events):
                    await _send_audio(ws, _voiced(_speech(SENTENCE, rate)), rate, pace=1.0)
        await send_json(ws, {"type": "commit"})
        final = await asyncio.wait_for(reader, 30)
    return events, final


async def test_asr_stream_partials_only_when_asked(lite_stack: Stack) -> None:
    (with_partials, final), (without, final_without) = await asyncio.gather(
        _long_utterance(lite_stack, True), _long_utterance(lite_stack, False)
    )
    started = with_partials[0]
    assert started["type"] == "speech.started"
    partials = [e for e in with_partials if e["type"] == "transcript.partial"]
    assert partials, with_partials
    assert all(p["segment_id"] == started["segment_id"] == final["segment_id"] for p in partials)
    assert all(p["text"].strip() for p in partials)
    assert recall(LONG, final["text"]) >= 0.6, final
    assert [e["type"] for e in without] == ["speech.started"], without
    assert recall(LONG, final_without["text"]) >= 0.6, final_without


@pytest.mark.parametrize(
    ("service", "path"),
    [("gateway", "/v1/stream"), ("asr", "/v1/stream/asr"), ("tts", "/v1/stream/tts")],
)
async def test_servers_never_send_permessage_deflate(
    lite_stack: Stack, service: str, path: str
) -> None:
    url = lite_stack.servers[service].ws + path
    async with websockets.asyncio.client.connect(url, compression="deflate") as ws:
        assert ws.response is not None
        assert "Sec-WebSocket-Extensions" not in ws.response.headers
        assert ws.protocol.extensions == []
        assert json.loads(await ws.recv())["type"] in ("session.created", "ready")


# ---------------------------------------------------------------- TTS stream


def _tts_url(stack: Stack) -> str:
    return f"{stack.tts.ws}/v1/stream/tts"


async def _read_request(ws: ClientConnection) -> tuple[Json, bytes, Json]:
    """audio.start, the binary chunks, audio.done of the next request (nothing else between)."""
    start = await recv_json(ws)
    assert start["type"] == "audio.start", start
    done, between, audio = await recv_until(ws, "audio.done")
    assert between == [], between
    assert done["id"] == start["id"]
    assert abs(len(audio) / 2 / start["sample_rate"] * 1000 - done["audio_ms"]) <= 1
    return start, audio, done


async def test_tts_stream_serves_requests_in_order(lite_stack: Stack) -> None:
    async with connect(_tts_url(lite_stack)) as ws:
        assert await recv_json(ws) == {"type": "ready"}
        await send_json(ws, {"type": "speak", "id": "first", "text": "one two three four five"})
        await send_json(ws, {"type": "speak", "id": "second", "text": "six"})
        start_1, audio_1, done_1 = await _read_request(ws)
        start_2, _, done_2 = await _read_request(ws)
    assert (start_1["id"], start_2["id"]) == ("first", "second")
    assert done_1["status"] == done_2["status"] == "completed"
    assert start_1["sample_rate"] == start_2["sample_rate"] == 22050  # the Piper voice's own rate
    assert done_1["audio_ms"] > done_2["audio_ms"] > 200
    assert float(np.abs(pcm16_to_float(audio_1)).max()) > 0.05


async def test_tts_stream_honours_sample_rate(lite_stack: Stack) -> None:
    text = "the quick brown fox"
    async with connect(_tts_url(lite_stack)) as ws:
        assert await recv_json(ws) == {"type": "ready"}
        for rate in (8000, 16000, 24000, 48000):
            await send_json(
                ws, {"type": "speak", "id": f"r{rate}", "text": text, "sample_rate": rate}
            )
        results = [await _read_request(ws) for _ in range(4)]
    durations = []
    for rate, (start, audio, done) in zip((8000, 16000, 24000, 48000), results, strict=True):
        assert (start["id"], start["sample_rate"], done["status"]) == (
            f"r{rate}",
            rate,
            "completed",
        )
        durations.append(len(audio) / 2 / rate)
        assert abs(done["audio_ms"] - 1000 * durations[-1]) <= 1
        # Band-limited: a 48 kHz reply holds no energy above the voice's Nyquist (11 kHz).
        if rate == 48000:
            spectrum = np.abs(np.fft.rfft(pcm16_to_float(audio)))
            freqs = np.fft.rfftfreq(len(audio) // 2, 1 / rate)
            assert spectrum[freqs > 12000].sum() < 0.01 * spectrum.sum()
    # the same text at every rate (Piper's phoneme durations carry a little noise)
    assert max(durations) < 1.15 * min(durations), durations


async def test_tts_stream_cancel_mid_stream(lite_stack: Stack) -> None:
    text = " ".join(["a long sentence that keeps the speaker busy for a while."] * 60)
    async with connect(_tts_url(lite_stack)) as ws:
        assert await recv_json(ws) == {"type": "ready"}
        await send_json(ws, {"type": "speak", "id": "long", "text": text})
        await send_json(ws, {"type": "speak", "id": "next", "text": "still here"})
        start = await recv_json(ws)
        assert start == {"type": "audio.start", "id": "long", "sample_rate": 22050}
        first = await ws.recv()
        assert isinstance(first, bytes) and first
        await send_json(ws, {"type": "cancel", "id": "long"})
        done, between, audio = await recv_until(ws, "audio.done")
        assert between == []
        assert (done["id"], done["status"]) == ("long", "cancelled")
        sent_ms = (len(first) + len(audio)) / 2 / 22050 * 1000
        assert abs(sent_ms - done["audio_ms"]) <= 1
        assert 0 < done["audio_ms"] < 120_000  # the text is about five minutes of speech
        # The next request is served whole, and a late cancel of a finished id is harmless.
        _, _, next_done = await _read_request(ws)
        assert (next_done["id"], next_done["status"]) == ("next", "completed")
        await send_json(ws, {"type": "cancel", "id": "next"})
        await send_json(ws, {"type": "speak", "id": "next", "text": "again"})
        _, _, again = await _read_request(ws)
        assert (again["id"], again["status"]) == ("next", "completed")


def _speculative(stack: Stack) -> dict[str, float]:
    text = httpx.get(f"{stack.asr.http}/metrics", timeout=10).text
    found = re.findall(r'^va_asr_speculative_total\{outcome="(\w+)"\} (\S+)$', text, re.M)
    return {outcome: float(value) for outcome, value in found}


async def test_asr_stream_final_is_the_pause_s_speculation_or_it_is_wasted(
    lite_stack: Stack,
) -> None:
    """A pause starts the final's transcription; silence keeps it (the same audio, so the
    same text); speech after the pause wastes it, and still exactly one final comes."""
    rate = 16000
    before = _speculative(lite_stack)
    first, second = _speech("what is the weather like", rate), _speech("in paris today", rate)
    async with connect(_asr_url(lite_stack, rate, partials=False)) as ws:
        await recv_json(ws)
        gap = _silence(350, rate)  # a pause (200 ms), not the end of the turn (600 ms)
        await _send_audio(ws, np.concatenate([_silence(LEAD_MS, rate), first, gap, second]), rate)
        await _send_audio(ws, _silence(1500, rate), rate, pace=4.0)
        final, _, _ = await recv_until(ws, "transcript.final", timeout_s=20)
        await _send_audio(ws, _silence(500, rate), rate, pace=4.0)
        await send_json(ws, {"type": "close"})
        later = [e async for e in _events_until_close(ws)]
    assert recall(SENTENCE, final["text"]) >= 0.8, final
    assert not any(e.get("type") == "transcript.final" for e in later), later
    after = _speculative(lite_stack)
    grown = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in ("used", "wasted")}
    assert grown["used"] == 1 and grown["wasted"] >= 1, grown  # "like" pause, then the end


async def _events_until_close(ws: ClientConnection) -> AsyncIterator[Json]:
    with contextlib.suppress(websockets.ConnectionClosed):
        async for message in ws:
            if isinstance(message, str):
                yield json.loads(message)
