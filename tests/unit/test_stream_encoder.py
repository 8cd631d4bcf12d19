"""Speech encoded chunk by chunk: bytes after every chunk, a whole that decodes."""

from __future__ import annotations

import numpy as np
import pytest

from services.common.audio.pcm import decode_file
from services.common.audio.stream_encoder import StreamEncoder, stream_rate

RATE = 24000


def tone(seconds: float, rate: int = RATE) -> np.ndarray:
    t = np.arange(int(rate * seconds), dtype=np.float32) / rate
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav"])
def test_every_chunk_gives_bytes_and_the_whole_decodes(fmt: str) -> None:
    encoder = StreamEncoder(fmt, RATE)
    parts = [encoder.start()]
    for _ in range(3):
        piece = encoder.encode(tone(0.2))
        assert piece, fmt  # sent with its chunk, not held to the end
        parts.append(piece)
    parts.append(encoder.finish())
    audio = decode_file(b"".join(parts), RATE)
    priming = 0.1 if fmt in ("mp3", "aac") else 0.0
    assert 0.6 - 0.03 <= audio.size / RATE <= 0.6 + priming + 0.03, fmt
    encoder.close()  # idempotent after finish


def test_pcm_is_raw_and_opus_needs_its_own_rates() -> None:
    encoder = StreamEncoder("pcm", 22050)
    assert encoder.start() == b"" and len(encoder.encode(tone(0.1))) == 2 * 2400
    assert stream_rate("opus", 22050) == 24000 and stream_rate("mp3", 22050) == 22050
    assert stream_rate("mp3", 9000) == 11025 and stream_rate("opus", 44100) == 48000
    assert stream_rate("pcm", 9000) == 9000 and stream_rate("flac", 9000) == 9000
    with pytest.raises(ValueError, match="opus does not encode at 22050"):
        StreamEncoder("opus", 22050)
    with pytest.raises(ValueError, match="no streaming encoder"):
        StreamEncoder("ogg-vorbis", RATE)


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav"])
@pytest.mark.parametrize("asked", [8000, 9000, 11025, 22050, 23000, 44100, 47000, 48000])
def test_every_rate_the_speech_endpoint_takes_encodes(fmt: str, asked: int) -> None:
    """`POST /v1/audio/speech` takes any `sample_rate` from 8000 to 48000: each, mapped by
    stream_rate, opens its encoder (a refusal would come after the 200 was sent)."""
    rate = stream_rate(fmt, asked)
    assert rate >= asked
    encoder = StreamEncoder(fmt, rate)
    parts = [encoder.start(), encoder.encode(tone(0.1, rate)), encoder.finish()]
    assert b"".join(parts), (fmt, asked, rate)
    encoder.close()
