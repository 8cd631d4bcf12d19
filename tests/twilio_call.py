"""A simulated Twilio call: Twilio's side of a bidirectional Media Stream, as its documentation
shapes the messages (https://www.twilio.com/docs/voice/media-streams/websocket-messages).

It sends `connected`, `start` (with `customParameters`), then a `media` message every 20 ms
for the whole call, as a phone line does: 160 bytes of mu-law at 8 kHz, silence unless it
is saying something. It plays what the gateway sends at real time through a playout
buffer, answers each `mark` once the audio before it has played (at once, for those a
`clear` drops), and ends with `stop`.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import websockets
from websockets.asyncio.client import ClientConnection

from services.common.audio import g711
from services.common.audio.pcm import AudioF32, float_to_pcm16, speech_end

FRAME_MS = 20
FRAME_BYTES = 8 * FRAME_MS  # mu-law at 8 kHz: one byte a sample
SILENCE = b"\xff" * FRAME_BYTES  # mu-law's zero
ACCOUNT = "AC" + "0" * 32
CALL = "CA" + "1" * 32


@dataclass
class Heard:
    """What the caller got from the gateway, with arrival times (time.monotonic)."""

    audio: bytearray = field(default_factory=bytearray)
    """Every mu-law byte received."""
    media_at: list[float] = field(default_factory=list)
    marks: list[tuple[float, str]] = field(default_factory=list)
    """Marks received (time, name)."""
    marks_returned: list[tuple[float, str]] = field(default_factory=list)
    """Marks sent back, once played or cleared."""
    clears: list[float] = field(default_factory=list)
    others: list[dict[str, Any]] = field(default_factory=list)
    """Any message a Twilio stream would not expect (none should come)."""


class TwilioCall:
    """One call to `/v1/twilio` (`async with`), Twilio's side of it."""

    def __init__(
        self,
        url: str,
        parameters: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        source: str | None = None,
    ) -> None:
        self.url = url
        self.parameters = parameters or {}
        self.headers = headers or {}
        """Sent with the upgrade, as Twilio sends its `X-Twilio-Signature`."""
        self.source = source
        """The local address to call from (any 127.x.y.z is loopback on Linux)."""
        self.stream_sid = "MZ" + "2" * 32
        self.heard = Heard()
        self.speech_ended_at: float | None = None
        """When the last speech `say` queued finished going out (its trailing silence not)."""
        self._sequence = 0
        self._chunk = 0
        self._queue: collections.deque[bytes] = collections.deque()
        self._speech_left = 0  # frames of speech still queued, before trailing silence
        self._said = asyncio.Event()
        self._play_end = 0.0  # when the playout buffer runs dry
        self._pending: dict[str, asyncio.TimerHandle] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.ws: ClientConnection | None = None

    async def __aenter__(self) -> TwilioCall:
        local = {"local_addr": (self.source, 0)} if self.source else {}
        self.ws = await websockets.connect(
            self.url, open_timeout=10, additional_headers=self.headers, **local
        )
        await self._send({"event": "connected", "protocol": "Call", "version": "1.0.0"})
        start = {
            "accountSid": ACCOUNT,
            "streamSid": self.stream_sid,
            "callSid": CALL,
            "tracks": ["inbound"],
            "customParameters": self.parameters,
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        }
        await self._send({"event": "start", "start": start, "streamSid": self.stream_sid})
        self.started_at = time.monotonic()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._line()), loop.create_task(self._listen())]
        return self

    async def __aexit__(self, *_: object) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.ws is not None:
            await self.ws.close()

    async def stop(self) -> int | None:
        """Hang up (`stop`) and wait for the gateway to close; its close code."""
        self._tasks[0].cancel()
        stop = {"accountSid": ACCOUNT, "callSid": CALL}
        await self._send({"event": "stop", "streamSid": self.stream_sid, "stop": stop})
        assert self.ws is not None
        await asyncio.wait_for(self.ws.wait_closed(), 15)
        return self.ws.close_code

    async def say(self, audio: AudioF32) -> None:
        """Speak 8 kHz audio into the line; returns once it has gone out."""
        pcm = float_to_pcm16(audio)
        coded = g711.encode(pcm, "pcmu")
        coded += SILENCE[: -len(coded) % FRAME_BYTES]
        frames = [coded[i : i + FRAME_BYTES] for i in range(0, len(coded), FRAME_BYTES)]
        trailing = (audio.size - speech_end(audio)) // FRAME_BYTES
        self._said.clear()
        self._speech_left = len(frames) - trailing
        self._queue.extend(frames)
        await self._said.wait()

    async def _send(self, message: dict[str, Any]) -> None:
        assert self.ws is not None
        if message["event"] != "connected":
            self._sequence += 1
            message = {"sequenceNumber": str(self._sequence), **message}
        await self.ws.send(json.dumps(message))

    async def _line(self) -> None:
        """A media message every 20 ms, on the clock, for the whole call."""
        start = time.monotonic()
        n = 0
        while True:
            frame = self._queue.popleft() if self._queue else SILENCE
            last_of_speech = self._speech_left == 1
            self._speech_left = max(0, self._speech_left - 1)
            self._chunk += 1
            media = {
                "track": "inbound",
                "chunk": str(self._chunk),
                "timestamp": str(n * FRAME_MS),
                "payload": base64.b64encode(frame).decode("ascii"),
            }
            await self._send({"event": "media", "streamSid": self.stream_sid, "media": media})
            if last_of_speech:  # as a paced client counts it: when its last frame went out
                self.speech_ended_at = time.monotonic()
            if not self._queue:
                self._said.set()
            n += 1
            delay = start + n * FRAME_MS / 1000 - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)

    async def _listen(self) -> None:
        assert self.ws is not None
        async for text in self.ws:
            message = json.loads(text)
            now = time.monotonic()
            match message.get("event"):
                case "media":
                    assert message["streamSid"] == self.stream_sid
                    audio = base64.b64decode(message["media"]["payload"])
                    self.heard.audio += audio
                    self.heard.media_at.append(now)
                    self._play_end = max(self._play_end, now) + len(audio) / 8000
                case "mark":
                    name = message["mark"]["name"]
                    self.heard.marks.append((now, name))
                    loop = asyncio.get_running_loop()
                    handle = loop.call_at(
                        loop.time() + max(0.0, self._play_end - now), self._return_mark, name
                    )
                    self._pending[name] = handle
                case "clear":
                    self.heard.clears.append(now)
                    self._play_end = now
                    for name, handle in list(self._pending.items()):
                        handle.cancel()
                        self._return_mark(name)
                case _:
                    self.heard.others.append(message)

    def _return_mark(self, name: str) -> None:
        self._pending.pop(name, None)
        self.heard.marks_returned.append((time.monotonic(), name))
        mark = {"event": "mark", "streamSid": self.stream_sid, "mark": {"name": name}}
        self._tasks.append(asyncio.get_running_loop().create_task(self._send(mark)))

    def pcm16(self) -> bytes:
        """The agent's audio as heard, decoded to PCM16 at 8 kHz."""
        return g711.decode(bytes(self.heard.audio), "pcmu")

    def first_audio_after(self, at: float) -> float | None:
        return next((t for t in self.heard.media_at if t >= at), None)


def silence(seconds: float) -> AudioF32:
    return np.zeros(int(8000 * seconds), np.float32)
