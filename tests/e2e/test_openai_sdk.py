"""The official `openai` Python SDK, unchanged, against both REST endpoints of the lite stack."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from functools import cache
from typing import Literal

import httpx
import numpy as np
import numpy.typing as npt
import openai
import pytest

from services.common.audio.pcm import decode_file, encode_audio, pcm16_to_float
from tests.conftest import Stack
from tests.e2e.wire import encode_file, recall
from tests.servers import ServerThread
from tests.speech import speak

SENTENCE = "what is the weather like in paris today"
SHORT = "hello from the speech service"
DECODE_RATE = 24000  # replies are decoded (and resampled) to this rate to measure them

Encoder = Callable[[npt.NDArray[np.float32], int], bytes]
Fmt = Literal["json", "text", "verbose_json", "srt", "vtt"]

# (file name, sample rate, encoder, response_format): every container the service decodes,
# at the rates real clients send, and every response format it renders.
UPLOADS: list[tuple[str, int, Encoder, Fmt]] = [
    ("speech.wav", 8000, lambda a, r: encode_audio(a, r, "wav"), "json"),
    ("speech.mp3", 22050, lambda a, r: encode_audio(a, r, "mp3"), "text"),
    ("speech.flac", 44100, lambda a, r: encode_audio(a, r, "flac"), "verbose_json"),
    ("speech.ogg", 48000, lambda a, r: encode_audio(a, r, "opus"), "srt"),
    ("vorbis.ogg", 44100, lambda a, r: encode_file(a, r, "ogg", "vorbis", channels=2), "vtt"),
    ("speech.webm", 48000, lambda a, r: encode_file(a, r, "webm", "libopus"), "json"),
]


def _sdk(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{server.http}/v1", api_key="sk-local", max_retries=0, timeout=30
    )


@pytest.fixture(scope="module")
def asr_client(lite_stack: Stack) -> Iterator[openai.OpenAI]:
    with _sdk(lite_stack.asr) as client:
        yield client


@pytest.fixture(scope="module")
def tts_client(lite_stack: Stack) -> Iterator[openai.OpenAI]:
    """A TTS service of its own whose Piper durations do not vary: the tests below tell
    the rate of the audio from its length (22 050 read as 24 000 Hz is 8 % shorter, and
    Piper's own variation between two syntheses of one text is up to 10 %)."""
    from services.tts.app import create_app
    from services.tts.settings import PiperSettings, TtsSection, TtsSettings

    steady = TtsSection(piper=PiperSettings(noise_w_scale=0.0))
    settings = TtsSettings(profile="lite", redis=lite_stack.redis, tts=steady)
    with ServerThread(create_app(settings)) as server, _sdk(server) as client:
        yield client


@cache
def _speech(rate: int) -> npt.NDArray[np.float32]:
    return speak(SENTENCE, rate)


# ---------------------------------------------------------------- transcriptions


@pytest.mark.parametrize(("name", "rate", "encoder", "fmt"), UPLOADS, ids=[u[0] for u in UPLOADS])
def test_transcription_formats(
    asr_client: openai.OpenAI, name: str, rate: int, encoder: Encoder, fmt: Fmt
) -> None:
    data = encoder(_speech(rate), rate)
    result = asr_client.audio.transcriptions.create(
        model="whisper-1",
        file=(name, io.BytesIO(data)),
        response_format=fmt,
    )
    if fmt == "json":
        assert isinstance(result, openai.types.audio.Transcription)
        text = result.text
    elif fmt == "verbose_json":
        assert isinstance(result, openai.types.audio.TranscriptionVerbose)
        text = result.text
        assert result.language == "en"
        assert 2.0 <= result.duration <= 3.2, result.duration
        assert result.segments and result.segments[0].text.strip() == text
        assert 0.0 < result.segments[-1].end <= result.duration
    else:
        assert isinstance(result, str)
        text = result
        if fmt == "srt":
            lines = text.strip().splitlines()
            assert lines[0] == "1"
            assert lines[1].startswith("00:00:00,000 --> 00:00:0"), lines
            text = " ".join(lines[2:])
        elif fmt == "vtt":
            lines = text.strip().splitlines()
            assert lines[0] == "WEBVTT" and lines[1] == ""
            assert lines[2].startswith("00:00:00.000 --> 00:00:0"), lines
            text = " ".join(lines[3:])
    assert recall(SENTENCE, text) >= 0.6, (name, text)


# ---------------------------------------------------------------- speech


PRIMING_S = {"mp3": 0.1, "aac": 0.1}
"""Streamed MP3 and AAC keep their encoder's priming (no header can be rewritten at the end
of a stream to tell decoders to drop it): up to one frame and the delay, under 0.1 s."""


def _duration_ok(
    samples: npt.NDArray[np.float32], rate: int, reference_s: float, fmt: str = "wav"
) -> None:
    seconds = samples.size / rate
    assert 1.0 <= seconds <= 5.0, seconds
    # Decoders drop Opus's pre-skip; a wrong rate would be off by 8 % (0.13 s here).
    priming = PRIMING_S.get(fmt, 0.0)
    assert reference_s - 0.03 <= seconds <= reference_s + priming + 0.03, (seconds, reference_s)
    assert float(np.sqrt(np.mean(samples**2))) > 0.01  # not silence


@pytest.fixture(scope="module")
def reference_s(tts_client: openai.OpenAI) -> float:
    wav = tts_client.audio.speech.create(
        model="tts-1", voice="alloy", input=SHORT, response_format="wav"
    ).content
    return decode_file(wav, DECODE_RATE).size / DECODE_RATE


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "opus", "aac"])
def test_speech_container_formats(tts_client: openai.OpenAI, fmt: str, reference_s: float) -> None:
    response = tts_client.audio.speech.create(
        model="tts-1",
        voice="alloy",
        input=SHORT,
        response_format=fmt,  # type: ignore[arg-type]
    )
    _duration_ok(decode_file(response.content, DECODE_RATE), DECODE_RATE, reference_s, fmt)
    if fmt == "opus":
        assert response.content[:4] == b"OggS"
        assert response.response.headers["content-type"] == "audio/ogg"


def test_speech_pcm_is_24k_like_openai(tts_client: openai.OpenAI, reference_s: float) -> None:
    """OpenAI's `pcm` is headerless 24 kHz PCM16 LE: clients can only assume that rate."""
    response = tts_client.audio.speech.create(
        model="tts-1", voice="alloy", input=SHORT, response_format="pcm"
    )
    data = response.content
    assert len(data) % 2 == 0
    samples = pcm16_to_float(data)
    _duration_ok(samples, 24000, reference_s)


def test_speech_is_understood(
    tts_client: openai.OpenAI, asr_client: openai.OpenAI, lite_stack: Stack
) -> None:
    """The SDK's speech, fed back to the SDK's transcription, says the words."""
    wav = tts_client.audio.speech.create(
        model="tts-1", voice="alloy", input=SENTENCE, response_format="wav"
    ).content
    text = asr_client.audio.transcriptions.create(
        model="whisper-1", file=("reply.wav", wav), response_format="text"
    )
    assert recall(SENTENCE, text) >= 0.6, text


def test_openai_voice_names_map_to_default_voice(
    tts_client: openai.OpenAI, lite_stack: Stack
) -> None:
    def pcm(voice: str) -> npt.NDArray[np.float32]:
        data = tts_client.audio.speech.create(
            model="tts-1", voice=voice, input="one two three", response_format="pcm"
        ).content
        return np.frombuffer(data, "<i2").astype(np.float32)

    # This service's durations do not vary (see tts_client): one voice, one length.
    default = pcm("default")
    assert default.size > 0
    for voice in ("alloy", "nova", "shimmer", "Onyx"):
        assert pcm(voice).size == default.size, voice
    listed = httpx.get(f"{lite_stack.tts.http}/v1/voices", timeout=10).json()
    assert listed["openai_voices"]["maps_to"] == listed["default"]
    assert {"alloy", "echo", "nova", "shimmer"} <= set(listed["openai_voices"]["names"])


def test_unknown_voice_is_bad_request(tts_client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        tts_client.audio.speech.create(model="tts-1", voice="no-such-voice", input="hello")
    assert caught.value.status_code == 400
    body = caught.value.body
    assert isinstance(body, dict)
    assert "unknown voice 'no-such-voice'" in body["message"]
    assert "/v1/voices" in body["message"]
    assert body["code"] == "invalid_message"
