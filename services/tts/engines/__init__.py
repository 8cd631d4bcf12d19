"""TTS engines by name. Factories import their model library only when chosen."""

from __future__ import annotations

from collections.abc import Callable

from services.tts.engines.base import TtsEngine
from services.tts.settings import TtsSection


def _piper(section: TtsSection) -> TtsEngine:
    from services.tts.engines.piper import PiperEngine

    return PiperEngine(section.piper)


def _espeak(section: TtsSection) -> TtsEngine:
    from services.tts.engines.espeak import EspeakEngine

    return EspeakEngine(section.espeak, chunk_ms=section.chunk_ms)


def _chatterbox(section: TtsSection) -> TtsEngine:
    from services.tts.engines.chatterbox import ChatterboxEngine

    return ChatterboxEngine(section.chatterbox)


def _fake(section: TtsSection) -> TtsEngine:
    from services.tts.engines.fake import FakeTtsEngine

    return FakeTtsEngine(section.fake, chunk_ms=section.chunk_ms)


ENGINES: dict[str, Callable[[TtsSection], TtsEngine]] = {
    "piper": _piper,
    "espeak": _espeak,
    "chatterbox": _chatterbox,
    "fake": _fake,
}


def create_engine(section: TtsSection) -> TtsEngine:
    """The engine the settings name; an unknown name fails fast with the choices."""
    try:
        factory = ENGINES[section.engine]
    except KeyError:
        choices = ", ".join(sorted(ENGINES))
        raise ValueError(
            f"unknown TTS engine {section.engine!r}; choose one of {choices}"
        ) from None
    return factory(section)
