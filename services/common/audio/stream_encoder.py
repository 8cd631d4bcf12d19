"""Compressed audio made chunk by chunk, so a streamed reply starts with its first piece.

`StreamEncoder` keeps one PyAV container open on a write-only sink: each chunk of PCM
is encoded and muxed as it comes, and the bytes it produced are handed back at once
(mp3 frames, Ogg pages of Opus, ADTS frames of AAC, FLAC frames, WAV samples). The
sink cannot seek, so nothing is rewritten at the end: a streamed WAV carries the
"unknown length" sizes (0xFFFFFFFF) every streaming WAV writer uses, a streamed FLAC
has no total in its STREAMINFO, and a streamed MP3 has no LAME header, so decoders
keep the encoder's priming (about 50 ms of silence at the start) that a whole-file
MP3 tells them to drop. Ogg pages are closed every 20 ms of audio (not every second),
so an Opus page leaves with the chunk that filled it.
"""

from __future__ import annotations

from typing import Any, Final

import av
import numpy as np

from services.common.audio.pcm import ENCODINGS, AudioF32, float_to_pcm16

CODEC_RATES: Final[dict[str, tuple[int, ...]]] = {
    "opus": (8000, 12000, 16000, 24000, 48000),
    "mp3": (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000),
    "aac": (7350, 8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000),
}
"""The rates each codec that has a set of them encodes at (FFmpeg's libopus, libmp3lame and
aac refuse others); audio at another rate must be resampled first."""
_OPTIONS: Final = {"ogg": {"page_duration": "20000"}}
"""Muxer options per container: Ogg closes a page every 20 ms (its default is 1 s)."""


class _Sink:
    """A write-only file for PyAV: it collects what the muxer writes until taken."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: Any) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data = b"".join(self._parts)
        self._parts.clear()
        return data


def stream_rate(response_format: str, rate: int) -> int:
    """The rate to synthesize at for a streamed `response_format` asked at `rate`: a codec
    that lacks `rate` takes the nearest of its own at or above it (none of the band asked
    for is lost; 9000 Hz in mp3 is 11025)."""
    rates = CODEC_RATES.get(response_format)
    if rates is None or rate in rates:
        return rate
    return next((own for own in rates if own >= rate), rates[-1])


class StreamEncoder:
    """One streamed response: `start()`, then `encode(chunk)` per chunk, then `finish()`;
    each returns the bytes to send now (possibly none). `pcm` is raw PCM16."""

    def __init__(self, response_format: str, rate: int) -> None:
        if response_format != "pcm" and response_format not in ENCODINGS:
            raise ValueError(f"no streaming encoder for {response_format!r}")
        if stream_rate(response_format, rate) != rate:
            raise ValueError(f"{response_format} does not encode at {rate} Hz (use stream_rate)")
        self.response_format = response_format
        self.rate = rate
        self._sink = _Sink()
        self._container: Any = None
        self._stream: Any = None

    def start(self) -> bytes:
        """The container's header (empty for pcm; ADTS has none)."""
        if self.response_format == "pcm":
            return b""
        container_fmt, codec, _ = ENCODINGS[self.response_format]
        self._container = av.open(
            self._sink, mode="w", format=container_fmt, options=_OPTIONS.get(container_fmt, {})
        )
        self._stream = self._container.add_stream(codec, rate=self.rate, layout="mono")
        self._container.start_encoding()
        return self._sink.take()

    def encode(self, audio: AudioF32) -> bytes:
        """The bytes one chunk of mono float audio makes now."""
        if self.response_format == "pcm":
            return float_to_pcm16(audio)
        if self._stream is None:
            raise RuntimeError("StreamEncoder.start() was not called")
        if audio.size:
            pcm = np.frombuffer(float_to_pcm16(audio), dtype="<i2").reshape(1, -1)
            frame = av.AudioFrame.from_ndarray(pcm, format="s16", layout="mono")
            frame.sample_rate = self.rate
            for packet in self._stream.encode(frame):
                self._container.mux(packet)
        return self._sink.take()

    def finish(self) -> bytes:
        """The encoder's last frames and the container's trailer."""
        if self.response_format == "pcm" or self._container is None:
            return b""
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self.close()
        return self._sink.take()

    def close(self) -> None:
        """Release the codec (an abandoned stream included); idempotent."""
        container, self._container = self._container, None
        if container is not None:
            container.close()
