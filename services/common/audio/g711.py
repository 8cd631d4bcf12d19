"""G.711 (ITU-T G.711, 1972): mu-law and A-law, the 8 kHz, 8-bit telephone codecs.

Every phone network and its WebSocket bridges (Twilio Media Streams, OpenAI Realtime's
`audio/pcmu` and `audio/pcma`) carry them. Each byte is one sample, companded from 14-bit
(mu-law) or 13-bit (A-law) linear PCM; both are memoryless, so a frame is coded by table
look-up and nothing is held back: no delay beyond the sample. The tables are built once
from the standard's segment rules (the reference coder's arithmetic, which ffmpeg's
`pcm_mulaw`/`pcm_alaw` also use; tests/unit/test_g711.py checks every code both ways
against it). `audioop` did this until Python 3.13 removed it.
"""

from __future__ import annotations

from typing import Final, Literal

import numpy as np
import numpy.typing as npt

from services.common.errors import InvalidAudio

Law = Literal["pcmu", "pcma"]
"""`pcmu`: mu-law (North America, Japan; Twilio's only one). `pcma`: A-law (elsewhere)."""
RATE: Final = 8000
"""G.711's one sample rate."""

_BIAS: Final = 0x84
_ULAW_CLIP: Final = 8159  # of the 14-bit magnitude (32635 >> 2)


def _segment(magnitude: npt.NDArray[np.int32], first_end: int) -> npt.NDArray[np.int32]:
    """Which of the 8 segments (each twice as wide as the last) holds each magnitude; 8:
    beyond the last. Segment s ends at `first_end * 2**s + (2**s - 1)`."""
    ends = np.array([((first_end + 1) << s) - 1 for s in range(8)], np.int32)
    segment: npt.NDArray[np.int32] = np.searchsorted(ends, magnitude, side="left").astype(np.int32)
    return segment


def _ulaw_encoder() -> npt.NDArray[np.uint8]:
    pcm = np.arange(-32768, 32768, dtype=np.int32) >> 2  # 14-bit
    mask = np.where(pcm < 0, 0x7F, 0xFF)
    magnitude = np.minimum(np.abs(pcm), _ULAW_CLIP) + (_BIAS >> 2)
    segment = _segment(magnitude, 0x3F)
    code = (segment << 4) | ((magnitude >> (segment + 1)) & 0x0F)
    table: npt.NDArray[np.uint8] = (np.where(segment >= 8, 0x7F, code) ^ mask).astype(np.uint8)
    return table


def _ulaw_decoder() -> npt.NDArray[np.int16]:
    code = ~np.arange(256, dtype=np.int32) & 0xFF
    magnitude = (((code & 0x0F) << 3) + _BIAS) << ((code & 0x70) >> 4)
    table: npt.NDArray[np.int16] = np.where(
        code & 0x80, _BIAS - magnitude, magnitude - _BIAS
    ).astype(np.int16)
    return table


def _alaw_encoder() -> npt.NDArray[np.uint8]:
    pcm = np.arange(-32768, 32768, dtype=np.int32) >> 3  # 13-bit
    mask = np.where(pcm >= 0, 0xD5, 0x55)
    magnitude = np.where(pcm >= 0, pcm, -pcm - 1)
    segment = _segment(magnitude, 0x1F)
    shift = np.where(segment < 2, 1, segment)
    code = (segment << 4) | ((magnitude >> shift) & 0x0F)
    table: npt.NDArray[np.uint8] = (np.where(segment >= 8, 0x7F, code) ^ mask).astype(np.uint8)
    return table


def _alaw_decoder() -> npt.NDArray[np.int16]:
    code = np.arange(256, dtype=np.int32) ^ 0x55
    segment = (code & 0x70) >> 4
    base = ((code & 0x0F) << 4) + np.where(segment == 0, 8, 0x108)
    magnitude = np.where(segment > 1, base << np.maximum(segment - 1, 0), base)
    table: npt.NDArray[np.int16] = np.where(code & 0x80, magnitude, -magnitude).astype(np.int16)
    return table


_ENCODE: Final[dict[str, npt.NDArray[np.uint8]]] = {
    "pcmu": _ulaw_encoder(),
    "pcma": _alaw_encoder(),
}
"""Indexed by a PCM16 sample + 32768 (64 KiB each)."""
_DECODE: Final[dict[str, npt.NDArray[np.int16]]] = {
    "pcmu": _ulaw_decoder(),
    "pcma": _alaw_decoder(),
}


def encode(pcm16: bytes, law: Law) -> bytes:
    """PCM16 little-endian → one G.711 byte per sample. Odd lengths are InvalidAudio."""
    if len(pcm16) % 2:
        raise InvalidAudio(f"PCM16 audio must have an even number of bytes, got {len(pcm16)}")
    samples = np.frombuffer(pcm16, dtype="<i2").astype(np.int32) + 32768
    coded: bytes = _ENCODE[law][samples].tobytes()
    return coded


def decode(data: bytes, law: Law) -> bytes:
    """G.711 bytes → PCM16 little-endian, one sample per byte."""
    codes = np.frombuffer(data, dtype=np.uint8)
    pcm: bytes = _DECODE[law][codes].astype("<i2").tobytes()
    return pcm
