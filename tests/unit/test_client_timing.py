"""Where `voice-agent client`, the benchmarks and the load tester start voice-to-voice:
when the frame holding the last voiced sample is sent. It was the end of the paced send
less the trailing quiet, up to a frame later (the understated figure was the project's)."""

from __future__ import annotations

import time

import numpy as np

from services.client.stream import StreamClient


class _Recorder:
    """Stands in for the socket: when each frame left."""

    def __init__(self) -> None:
        self.sent: list[tuple[float, bytes]] = []

    async def send(self, frame: bytes) -> None:
        self.sent.append((time.monotonic(), frame))


async def test_voice_to_voice_starts_when_the_last_voiced_frame_leaves() -> None:
    rate = 16000
    voiced = 0.3 * np.sin(2 * np.pi * 200 * np.arange(int(0.23 * rate)) / rate)
    audio = np.concatenate([voiced, np.zeros(int(0.2 * rate))]).astype(np.float32)
    client = StreamClient("ws://unused")
    client.ws = _Recorder()
    client.session = {"input_sample_rate": rate}
    turn = await client.speak(audio, rate, frame_ms=20, lead_silence_ms=40)
    sent = client.ws.sent
    loud = [i for i, (_, frame) in enumerate(sent) if np.abs(np.frombuffer(frame, np.int16)).max()]
    last = loud[-1]  # 40 ms of lead and 230 ms of tone: the 14th 20 ms frame holds its end
    assert last == 13
    assert turn.last_speech_sent_at is not None
    assert sent[last - 1][0] <= turn.last_speech_sent_at <= sent[last][0]
