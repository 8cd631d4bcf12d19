"""What the simulated users say: espeak-ng sentences made on the spot, or a folder of wavs.

Every utterance is mono float32 at 16 kHz (the gateway's default input rate), with
the script it reads when known (for word accuracy).
"""

from __future__ import annotations

import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np

from services.client.stream import read_wav
from services.common.audio.pcm import AudioF32, resample

RATE: Final = 16000
SENTENCES: Final = (
    "what is the weather like in paris today",
    "please call stella and ask her to bring these things with her from the store",
    "turn left at the next corner",
    "tell me a story about the sea",
    "how long does it take to drive to new york",
    "i would like to book a table for two people",
    "can you remind me to buy milk tomorrow morning",
    "what time does the train leave",
    "the meeting has been moved to thursday afternoon",
    "where is the nearest pharmacy",
    "set a timer for ten minutes",
    "read me the news headlines",
    "is it going to rain today",
    "how are you doing today",
    "what is your name",
    "tell me a story about the moon",
)
"""Short requests to a voice agent, with words whose spelling is not in doubt."""
ESPEAK_VOICE: Final = "en-us"
ESPEAK_WPM: Final = 160
_DITHER_SEED: Final = 20240613
_LSB: Final = 1.0 / 32768.0


@dataclass(frozen=True)
class Utterance:
    name: str
    audio: AudioF32
    script: str | None


class CorpusError(Exception):
    """The corpus cannot be built; the message says why."""


def espeak_corpus(sentences: tuple[str, ...] = SENTENCES) -> list[Utterance]:
    """`sentences` spoken by espeak-ng (in-process), with a microphone's noise floor."""
    from services.tts.engines.base import SpeechRequest
    from services.tts.engines.espeak import EspeakEngine
    from services.tts.settings import EspeakSettings

    engine = EspeakEngine(EspeakSettings(default_voice=ESPEAK_VOICE, words_per_minute=ESPEAK_WPM))
    try:
        engine.load()
    except Exception as exc:
        raise CorpusError(f"espeak-ng is unavailable ({exc}); pass --audio DIR") from exc
    corpus = []
    for i, text in enumerate(sentences):
        chunks = list(engine.synthesize(SpeechRequest(text=text, voice=ESPEAK_VOICE)))
        audio = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
        audio = _dithered(resample(audio, engine.sample_rate, RATE))
        corpus.append(Utterance(f"espeak-{i:02d}", audio, text))
    return corpus


def _dithered(audio: AudioF32) -> AudioF32:
    """±2 LSB TPDF dither: a microphone never hears digital silence."""
    rng = np.random.default_rng(_DITHER_SEED)
    noise = (rng.uniform(-1.0, 1.0, audio.size) + rng.uniform(-1.0, 1.0, audio.size)) * _LSB
    return np.clip(audio + noise, -1.0, 1.0 - _LSB).astype(np.float32)


def folder_corpus(folder: Path) -> list[Utterance]:
    """Every `*.wav` in `folder` (16-bit PCM, any rate), with `NAME.txt` as its script."""
    paths = sorted(folder.glob("*.wav"))
    if not paths:
        raise CorpusError(f"no .wav files in {folder}")
    corpus = []
    for path in paths:
        try:
            audio, rate = read_wav(path)
        except (OSError, ValueError, EOFError, wave.Error) as exc:
            raise CorpusError(f"{path}: {exc}") from exc
        if audio.size == 0:
            raise CorpusError(f"{path}: no samples")
        corpus.append(Utterance(path.stem, resample(audio, rate, RATE), _script(path)))
    return corpus


def _script(wav: Path) -> str | None:
    """The script beside `wav` (`NAME.txt`, UTF-8), None without one."""
    path = wav.with_suffix(".txt")
    if not path.exists():
        return None
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except (OSError, UnicodeDecodeError) as exc:
        raise CorpusError(f"{path}: not a readable UTF-8 script: {exc}") from exc
