"""Audio formats: PCM16 frames, resampling (soxr), decoding uploads and encoding replies (PyAV).

All internal audio is mono float32 in [-1, 1]; the wire carries PCM16 little-endian.
"""

from __future__ import annotations

import io
import itertools
from typing import Any, Final, Literal, get_args

import numpy as np
import numpy.typing as npt
import soxr

from services.common.errors import InvalidAudio, UnsupportedSampleRate

AudioF32 = npt.NDArray[np.float32]

SampleRate = Literal[8000, 16000, 24000, 48000]
"""A PCM16 sample rate the wire contract accepts (docs/protocol.md)."""
ALLOWED_SAMPLE_RATES: Final[tuple[int, ...]] = get_args(SampleRate)

_INT16_SCALE: Final = 32768.0
SILENT: Final = 0.01
"""Below this magnitude (-40 dBFS) a sample counts as silence."""


def check_sample_rate(rate: int) -> int:
    """Return `rate` if the wire contract allows it, else raise UnsupportedSampleRate."""
    if rate not in ALLOWED_SAMPLE_RATES:
        allowed = ", ".join(str(r) for r in ALLOWED_SAMPLE_RATES)
        raise UnsupportedSampleRate(f"sample rate {rate} is not supported; use one of {allowed}")
    return rate


def pcm16_to_float(data: bytes) -> AudioF32:
    """Decode PCM16 little-endian bytes; odd-length data is InvalidAudio."""
    if len(data) % 2:
        raise InvalidAudio(f"PCM16 audio must have an even number of bytes, got {len(data)}")
    samples = np.frombuffer(data, dtype="<i2").astype(np.float32)
    samples /= _INT16_SCALE
    return samples


def float_to_pcm16(audio: AudioF32) -> bytes:
    """Encode float audio as PCM16 little-endian, clipping to the valid range."""
    scaled = np.clip(audio, -1.0, 32767.0 / _INT16_SCALE) * _INT16_SCALE
    data: bytes = np.rint(scaled).astype("<i2").tobytes()
    return data


def speech_end(audio: AudioF32) -> int:
    """The sample after the last one louder than silence (0 when there is none): where a
    clip's sound ends and its trailing silence begins."""
    loud = np.flatnonzero(np.abs(audio) > SILENT)
    return int(loud[-1]) + 1 if loud.size else 0


def resample(audio: AudioF32, src_rate: int, dst_rate: int) -> AudioF32:
    """Band-limited resampling of a whole signal (soxr, high quality)."""
    if src_rate == dst_rate or audio.size == 0:
        return audio.astype(np.float32, copy=False)
    out = soxr.resample(audio, src_rate, dst_rate, quality="HQ")
    return np.asarray(out, dtype=np.float32)


class StreamResampler:
    """Resamples a stream frame by frame with state, so joins between frames are clean.

    soxr hands its output out in blocks: fed 20 ms at a time it holds back up to ~37 ms of
    the stream (16 to 24 kHz). Where that latency matters, `polyphase.PolyphaseResampler`
    holds back nothing beyond its filter's 1-4 ms."""

    def __init__(self, src_rate: int, dst_rate: int) -> None:
        self.src_rate = src_rate
        self.dst_rate = dst_rate
        self._stream = (
            None
            if src_rate == dst_rate
            else soxr.ResampleStream(src_rate, dst_rate, 1, dtype="float32", quality="HQ")
        )

    def process(self, audio: AudioF32, last: bool = False) -> AudioF32:
        """Resample the next frame; `last` flushes the filter's tail."""
        if self._stream is None:
            return audio
        out = self._stream.resample_chunk(audio.astype(np.float32, copy=False), last=last)
        return np.asarray(out, dtype=np.float32)


def ms_to_samples(ms: float, rate: int) -> int:
    """Milliseconds to a whole number of samples."""
    return round(ms * rate / 1000)


def samples_to_ms(samples: int, rate: int) -> int:
    """Samples to whole milliseconds."""
    return round(samples * 1000 / rate)


def _pyav() -> Any:
    """PyAV, imported where a file is decoded or encoded: its FFmpeg libraries load there,
    not in everything that only handles PCM frames (an engine benchmark, say)."""
    import av

    return av


def decode_file(data: bytes, target_rate: int, max_seconds: float | None = None) -> AudioF32:
    """Decode any container/codec PyAV knows (wav, mp3, flac, ogg, webm, ...) to mono float.

    Raises InvalidAudio for empty or undecodable input, and for one longer than
    `max_seconds` (decoding stops there: a small file of a low bitrate can hold hours).
    """
    return decode_file_rate(data, target_rate, max_seconds)[0]


def decode_file_rate(
    data: bytes, target_rate: int, max_seconds: float | None = None
) -> tuple[AudioF32, int]:
    """`decode_file`, and the file's own sample rate (8000: a phone recording)."""
    if not data:
        raise InvalidAudio("the uploaded file is empty")
    av = _pyav()
    most = None if max_seconds is None else int(max_seconds * target_rate)
    parts: list[AudioF32] = []
    decoded = 0
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.audio:
                raise InvalidAudio("the uploaded file has no audio stream")
            stream = container.streams.audio[0]
            source_rate = int(stream.rate or target_rate)
            resampler = av.AudioResampler(format="flt", layout="mono", rate=target_rate)
            frames = itertools.chain(container.decode(stream), [None])  # None: the flush
            for frame in frames:
                for out in resampler.resample(frame):
                    parts.append(out.to_ndarray().reshape(-1))
                    decoded += parts[-1].size
                if most is not None and decoded > most:
                    raise InvalidAudio(
                        f"the uploaded file holds more than {max_seconds:g} s of audio"
                    )
    except InvalidAudio:
        raise
    except (av.FFmpegError, ValueError, IndexError) as exc:
        raise InvalidAudio(f"the uploaded file is not audio that can be decoded: {exc}") from exc
    if not parts:
        raise InvalidAudio("the uploaded file holds no audio samples")
    return np.concatenate(parts).astype(np.float32, copy=False), source_rate


ENCODINGS: Final[dict[str, tuple[str, str, str]]] = {
    # response_format: (container, codec, media type)
    "wav": ("wav", "pcm_s16le", "audio/wav"),
    "flac": ("flac", "flac", "audio/flac"),
    "mp3": ("mp3", "libmp3lame", "audio/mpeg"),
    "opus": ("ogg", "libopus", "audio/ogg"),
    "aac": ("adts", "aac", "audio/aac"),
}


def media_type(response_format: str) -> str:
    """The HTTP media type of an encoded response format."""
    return "audio/pcm" if response_format == "pcm" else ENCODINGS[response_format][2]


def encode_audio(audio: AudioF32, rate: int, response_format: str) -> bytes:
    """Encode mono float audio as `pcm` (raw PCM16) or a container PyAV can write."""
    if response_format == "pcm":
        return float_to_pcm16(audio)
    container_fmt, codec, _ = ENCODINGS[response_format]
    out_rate = 48000 if codec == "libopus" and rate not in (8000, 12000, 16000, 24000) else rate
    if out_rate != rate:
        audio = resample(audio, rate, out_rate)
    pcm = np.frombuffer(float_to_pcm16(audio), dtype="<i2").reshape(1, -1)
    buf = io.BytesIO()
    av = _pyav()
    with av.open(buf, mode="w", format=container_fmt) as container:
        stream: Any = container.add_stream(codec, rate=out_rate, layout="mono")
        container.start_encoding()  # the header even with no samples: a valid empty file
        if pcm.size:
            frame = av.AudioFrame.from_ndarray(pcm, format="s16", layout="mono")
            frame.sample_rate = out_rate
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buf.getvalue()


def supported_encodings() -> list[str]:
    """The response formats this build of PyAV can write (wav and pcm always)."""
    found = ["pcm"]
    av = _pyav()
    for name, (_, codec, _) in ENCODINGS.items():
        try:
            av.codec.Codec(codec, "w")
        except (av.FFmpegError, ValueError):
            continue
        found.append(name)
    return found
