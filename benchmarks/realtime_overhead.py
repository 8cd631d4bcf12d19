"""What `/v1/realtime` (the OpenAI Realtime adapter) adds over `/v1/stream` for the same turns.

    python -m benchmarks.realtime_overhead --turns 10

Two measurements:
- adapter: the translation itself, in process. A recorded turn's native events (session,
  VAD, transcript, response, 3 s of 40 ms audio frames, deltas, done) go through the
  session channel's `send`/`send_audio` (RealtimeCodec) into a socket that discards, and
  20 ms base64 appends through `receive`; each call is timed. Every server event a realtime client
  gets is delayed by exactly its call's time, so its p99 is the added latency per event
  (the target: ≤ 5 ms p99).
- end_to_end: the lite stack as processes (`voice-agent up`'s layout); the same espeak-ng
  sentences spoken at real-time pace in 20 ms frames, alternately over /v1/stream (PCM16
  binary frames) and /v1/realtime (base64 `input_audio_buffer.append`), one turn at a
  time; voice-to-voice = last speech frame sent → first agent audio received. This shows
  the adapter in context, but ASR/TTS jitter on a shared CPU dominates its spread.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import websockets

from benchmarks.stack import lite_stack
from services.client.stream import StreamClient
from services.common.audio.pcm import float_to_pcm16
from services.common.protocol.events import (
    ResponseAudioDone,
    ResponseCreated,
    ResponseDone,
    ResponseTextDelta,
    SessionConfig,
    SessionCreated,
    SpeechStarted,
    SpeechStopped,
    TranscriptFinal,
)
from services.common.service.ws import Channel
from services.common.stats import percentile, summary
from services.gateway.codec import SessionChannel
from services.gateway.realtime import RealtimeCodec
from services.loadtest.corpus import SENTENCES
from services.loadtest.report import write
from tests.speech import speak

RATE = 24000
FRAME_MS = 20


class _NullSocket:
    """A WebSocket that discards what is sent and replays what it is given to receive."""

    application_state = None

    def __init__(self, incoming: list[str]) -> None:
        self.incoming = incoming

    async def send_text(self, _: str) -> None:
        return None

    async def send_bytes(self, _: bytes) -> None:
        return None

    async def receive(self) -> dict[str, Any]:
        return {"type": "websocket.receive", "text": self.incoming.pop()}


async def _adapter(turns: int) -> dict[str, Any]:
    """Per-call time of the adapter's translations, in microseconds, by direction."""
    out_us: list[float] = []
    in_us: list[float] = []
    frame = bytes(2 * RATE * 40 // 1000)
    append = json.dumps(
        {"type": "input_audio_buffer.append", "audio": base64.b64encode(bytes(960)).decode()}
    )
    for turn in range(turns):
        sock = _NullSocket([append] * 150)  # 3 s of 20 ms appends
        io = Channel(sock, "gateway", 1 << 20)  # type: ignore[arg-type]
        channel = SessionChannel(io, RealtimeCodec())
        utt, resp = f"utt_{turn}", f"resp_{turn}"
        events: list[Any] = [
            SessionCreated(session=SessionConfig(id=f"sess_{turn}", input_sample_rate=RATE)),
            SpeechStarted(utterance_id=utt, audio_start_ms=300),
            SpeechStopped(utterance_id=utt, audio_end_ms=2600),
            TranscriptFinal(
                utterance_id=utt, text=SENTENCES[0], audio_start_ms=300, audio_end_ms=2600
            ),
            ResponseCreated(response_id=resp, utterance_id=utt),
            *[ResponseTextDelta(response_id=resp, delta=w + " ") for w in SENTENCES[0].split()],
            *[frame] * 75,
            ResponseAudioDone(response_id=resp, audio_ms=3000),
            ResponseDone(response_id=resp, status="completed", text=SENTENCES[0]),
        ]
        for event in events:
            start = time.perf_counter_ns()
            if isinstance(event, bytes):
                await channel.send_audio(event)
            else:
                await channel.send(event)
            out_us.append((time.perf_counter_ns() - start) / 1000)
        for _ in range(150):
            start = time.perf_counter_ns()
            await channel.receive()
            in_us.append((time.perf_counter_ns() - start) / 1000)
    return {
        "unit": "microseconds per call",
        "server_events": {
            **summary(out_us),
            "p99": round(percentile(out_us, 99), 1),
            "n": len(out_us),
        },
        "client_appends": {
            **summary(in_us),
            "p99": round(percentile(in_us, 99), 1),
            "n": len(in_us),
        },
    }


def _frames(text: str) -> list[bytes]:
    audio = np.concatenate([np.zeros(RATE * 3 // 10, np.float32), speak(text, RATE)])
    step = RATE * FRAME_MS // 1000
    return [float_to_pcm16(audio[i : i + step]) for i in range(0, audio.size, step)]


async def _paced(frames: list[bytes], send: Any) -> float:
    start = time.monotonic()
    for i, frame in enumerate(frames):
        delay = start + i * FRAME_MS / 1000 - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await send(frame)
    return time.monotonic()


async def _silence(send: Any, until: asyncio.Event, limit_s: float = 30) -> None:
    """Keep the microphone open (silence) until the turn is answered."""
    quiet = bytes(2 * RATE * FRAME_MS // 1000)
    deadline = time.monotonic() + limit_s
    while not until.is_set() and time.monotonic() < deadline:
        await send(quiet)
        await asyncio.sleep(FRAME_MS / 1000)


async def _stream_turn(url: str, frames: list[bytes]) -> float:
    async with StreamClient(url) as client:
        turn = client.new_turn()
        await client.send({"type": "session.update", "session": {"input_sample_rate": RATE}})
        await client.wait_for("session.updated")
        sent_at = await _paced(frames, client.ws.send)
        answered = asyncio.Event()
        waiter = asyncio.create_task(client.wait_for("response.done", 60))
        waiter.add_done_callback(lambda _: answered.set())
        await _silence(client.ws.send, answered)
        await waiter
    assert turn.first_audio_at is not None, "no agent audio"
    return (turn.first_audio_at - sent_at) * 1000


async def _realtime_turn(url: str, frames: list[bytes]) -> float:
    async with websockets.connect(url, additional_headers={"Authorization": "Bearer x"}) as ws:

        async def send(frame: bytes) -> None:
            b64 = base64.b64encode(frame).decode()
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64}))

        first_audio: list[float] = []
        answered = asyncio.Event()

        async def read() -> None:
            async for message in ws:
                kind = json.loads(message)["type"]
                if kind == "response.output_audio.delta" and not first_audio:
                    first_audio.append(time.monotonic())
                if kind == "response.done":
                    answered.set()
                    return

        reader = asyncio.create_task(read())
        sent_at = await _paced(frames, send)
        await _silence(send, answered)
        await asyncio.wait_for(reader, 60)
    assert first_audio, "no agent audio"
    return (first_audio[0] - sent_at) * 1000


async def _end_to_end(gateway: str, turns: int) -> dict[str, Any]:
    ws = gateway.replace("http://", "ws://")
    stream: list[float] = []
    realtime: list[float] = []
    for i in range(turns):
        frames = _frames(SENTENCES[i % len(SENTENCES)])
        stream.append(await _stream_turn(f"{ws}/v1/stream", frames))
        realtime.append(await _realtime_turn(f"{ws}/v1/realtime?model=voice-agent", frames))
    p99 = {"stream": percentile(stream, 99), "realtime": percentile(realtime, 99)}
    return {
        "unit": "ms, last speech frame sent -> first agent audio received",
        "stream": {**summary(stream), "p99": round(p99["stream"], 1), "turns": stream},
        "realtime": {**summary(realtime), "p99": round(p99["realtime"], 1), "turns": realtime},
        "p50_difference_ms": round(percentile(realtime, 50) - percentile(stream, 50), 1),
        "p99_difference_ms": round(p99["realtime"] - p99["stream"], 1),
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    adapter = await _adapter(max(args.turns, 20))
    body: dict[str, Any] = {"benchmark": "realtime_overhead", "profile": "lite", "adapter": adapter}
    if not args.adapter_only:
        with lite_stack() as urls:
            body["end_to_end"] = await _end_to_end(urls["gateway"], args.turns)
    body["target"] = "adapter p99 per server event <= 5 ms"
    body["met"] = (
        adapter["server_events"]["p99"] <= 5000 and adapter["client_appends"]["p99"] <= 5000
    )
    return body


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--adapter-only", action="store_true")
    parser.add_argument(
        "--out", type=Path, default=Path("benchmarks/results/realtime_overhead_lite.json")
    )
    args = parser.parse_args()
    body = asyncio.run(main_async(args))
    write(args.out, body)
    print(json.dumps({k: body[k] for k in ("adapter", "met")}, indent=2))


if __name__ == "__main__":
    main()
