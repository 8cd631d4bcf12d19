"""Test speech made on the spot with espeak-ng (with a microphone's noise floor: dither) or
the packaged Piper voice, and speech heard back by a running ASR service.

Whisper tiny.en hears espeak's plain `en-us` at 160 words per minute about as well as a
neural voice (word error rate about 0.06 on tests/e2e/test_real_speech.py's sentences);
the buzzy `+klatt` variants cost it several points. Shared by the VAD, ASR and end-to-end
tests.
"""

from __future__ import annotations

from functools import cache

import httpx
import numpy as np
import numpy.typing as npt
import soxr

from services.common.audio.pcm import encode_audio, float_to_pcm16, resample
from services.tts.engines.base import SpeechRequest
from services.tts.engines.espeak import EspeakEngine
from services.tts.engines.piper import PiperEngine
from services.tts.settings import EspeakSettings, PiperSettings

_DITHER_SEED = 20240613
_LSB = 1.0 / 32768.0


@cache
def _engine(voice: str, wpm: int) -> EspeakEngine:
    engine = EspeakEngine(EspeakSettings(default_voice=voice, words_per_minute=wpm))
    engine.load()
    return engine


def speak(
    text: str, sample_rate: int = 16000, voice: str = "en-us", wpm: int = 160
) -> npt.NDArray[np.float32]:
    """`text` spoken by espeak-ng: mono float32 at `sample_rate`, with ±2 LSB TPDF dither."""
    engine = _engine(voice, wpm)
    chunks = list(engine.synthesize(SpeechRequest(text=text, voice=voice)))
    audio = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    if sample_rate != engine.sample_rate and audio.size:
        audio = soxr.resample(audio, engine.sample_rate, sample_rate, quality="VHQ")
    rng = np.random.default_rng(_DITHER_SEED)
    dither = (rng.uniform(-1.0, 1.0, audio.size) + rng.uniform(-1.0, 1.0, audio.size)) * _LSB
    return np.clip(audio + dither, -1.0, 1.0 - _LSB).astype(np.float32)


def to_pcm16(audio: npt.NDArray[np.float32]) -> bytes:
    """Little-endian PCM16 bytes of float audio in [-1, 1]."""
    return float_to_pcm16(audio)


def transcribed(asr_url: str, audio: npt.NDArray[np.float32], sample_rate: int) -> str:
    """What the ASR service at `asr_url` hears in `audio` (its REST door, as a WAV file)."""
    response = httpx.post(
        f"{asr_url}/v1/audio/transcriptions",
        files={"file": ("audio.wav", encode_audio(audio, sample_rate, "wav"), "audio/wav")},
        data={"model": "whisper-1"},
        timeout=60,
    )
    response.raise_for_status()
    return str(response.json()["text"])


@cache
def _piper(noise_w_scale: float | None) -> PiperEngine:
    engine = PiperEngine(PiperSettings(noise_w_scale=noise_w_scale))
    engine.load()
    return engine


def piper_speech(
    text: str, sample_rate: int = 16000, speed: float = 1.0, deterministic: bool = True
) -> npt.NDArray[np.float32]:
    """`text` said by the packaged Piper voice (joe) at `speed`, mono float32 at
    `sample_rate`. `deterministic` (the default: a test's input must not change from run to
    run): no phoneme-duration noise, the same audio every time; False: Piper's own noise,
    a slightly different take each call (benchmarks' voices, for variety). With the noise,
    Smart Turn's probability for "What is the weather like in Paris today?" ranged 0.41 to
    0.98 over runs, and a test asserting it failed once in CI."""
    engine = _piper(0.0 if deterministic else None)
    request = SpeechRequest(text=text, voice="joe", speed=speed)
    audio = np.concatenate(list(engine.synthesize(request)))
    return resample(audio, engine.sample_rate, sample_rate)
