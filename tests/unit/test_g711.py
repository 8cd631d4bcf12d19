"""G.711 against an independent coder (ffmpeg's, through PyAV) and values checked by hand
from ITU-T G.711's tables."""

from __future__ import annotations

import av
import numpy as np
import numpy.typing as npt
import pytest

from services.common.audio import g711
from services.common.errors import InvalidAudio

FFMPEG = {"pcmu": "pcm_mulaw", "pcma": "pcm_alaw"}
EVERY_SAMPLE = np.arange(-32768, 32768, dtype="<i2")


def ffmpeg_encode(pcm: npt.NDArray[np.int16], law: g711.Law) -> npt.NDArray[np.uint8]:
    encoder = av.CodecContext.create(FFMPEG[law], "w")
    encoder.sample_rate, encoder.layout, encoder.format = 8000, "mono", "s16"  # type: ignore[attr-defined]
    frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = 8000
    packets = [*encoder.encode(frame), *encoder.encode(None)]  # type: ignore[attr-defined]
    return np.frombuffer(b"".join(bytes(p) for p in packets), np.uint8)


def ffmpeg_decode(codes: bytes, law: g711.Law) -> npt.NDArray[np.int16]:
    decoder = av.CodecContext.create(FFMPEG[law], "r")
    decoder.sample_rate, decoder.layout = 8000, "mono"  # type: ignore[attr-defined]
    frames = decoder.decode(av.Packet(codes))  # type: ignore[attr-defined]
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype(np.int16)


def ours_decode(codes: bytes, law: g711.Law) -> npt.NDArray[np.int16]:
    return np.frombuffer(g711.decode(codes, law), "<i2").astype(np.int16)


@pytest.mark.parametrize("law", ["pcmu", "pcma"])
def test_every_code_decodes_as_ffmpeg_does(law: g711.Law) -> None:
    codes = bytes(range(256))
    assert np.array_equal(ours_decode(codes, law), ffmpeg_decode(codes, law))


@pytest.mark.parametrize("law", ["pcmu", "pcma"])
def test_every_sample_encodes_to_the_standard_code(law: g711.Law) -> None:
    """ffmpeg picks the nearest reconstruction value; G.711's decision levels differ from
    that only where two segments meet (and on exact ties): there the codes are neighbours,
    and everywhere the error stays within the code's own quantisation interval."""
    ours = np.frombuffer(g711.encode(EVERY_SAMPLE.tobytes(), law), np.uint8)
    theirs = ffmpeg_encode(EVERY_SAMPLE, law)
    differ = ours != theirs
    assert differ.mean() < 0.02
    table = ours_decode(bytes(range(256)), law).astype(np.int32)
    heard, nearest = table[ours], table[theirs]
    assert np.all(np.abs(heard[differ] - nearest[differ]) <= 1024)  # one step at most
    x = EVERY_SAMPLE.astype(np.int32)
    # a code's interval is as wide as the step between its neighbours (1024 at the top)
    assert np.all(np.abs(heard - x) <= 1024)
    small = np.abs(x) < 1000
    assert np.all(np.abs(heard[small] - x[small]) <= 40)  # fine steps near zero


@pytest.mark.parametrize("law", ["pcmu", "pcma"])
def test_codes_survive_a_round_trip(law: g711.Law) -> None:
    codes = bytes(range(256))
    again = g711.encode(g711.decode(codes, law), law)
    if law == "pcmu":  # mu-law has two zeros (0x7F and 0xFF): both come back as 0xFF
        codes = codes.replace(b"\x7f", b"\xff")
    assert again == codes


def test_hand_checked_values() -> None:
    """ITU-T G.711 tables 1a/2a: zero, the smallest steps and full scale."""
    assert g711.encode(np.array([0], "<i2").tobytes(), "pcmu") == b"\xff"
    assert g711.encode(np.array([0], "<i2").tobytes(), "pcma") == b"\xd5"
    assert ours_decode(b"\xff\x7f\x80\x00\xfe", "pcmu").tolist() == [0, 0, 32124, -32124, 8]
    assert ours_decode(b"\xd5\x55\xaa\x2a\xd4", "pcma").tolist() == [8, -8, 32256, -32256, 24]
    full = np.array([32767, -32768], "<i2").tobytes()
    assert g711.encode(full, "pcmu") == b"\x80\x00"
    assert g711.encode(full, "pcma") == b"\xaa\x2a"


def test_a_tone_survives_both_laws() -> None:
    t = np.arange(8000) / 8000
    tone = (np.sin(2 * np.pi * 440 * t) * 12000).astype("<i2")
    for law in ("pcmu", "pcma"):
        back = ours_decode(g711.encode(tone.tobytes(), law), law).astype(np.float64)
        noise = back - tone
        snr = 10 * np.log10(np.mean(tone.astype(np.float64) ** 2) / np.mean(noise**2))
        assert snr > 30  # G.711's ~38 dB across most of its range


def test_odd_pcm_is_refused() -> None:
    with pytest.raises(InvalidAudio):
        g711.encode(b"\x00\x01\x02", "pcmu")
