"""ASR engines by name. Factories import their model library only when chosen."""

from __future__ import annotations

from collections.abc import Callable

from services.asr.engines.base import AsrEngine
from services.asr.settings import AsrSection


def _faster_whisper(section: AsrSection) -> AsrEngine:
    from services.asr.engines.whisper import FasterWhisperEngine

    return FasterWhisperEngine(section.whisper)


def _fake(section: AsrSection) -> AsrEngine:
    from services.asr.engines.fake import FakeAsrEngine

    return FakeAsrEngine(section.fake)


ENGINES: dict[str, Callable[[AsrSection], AsrEngine]] = {
    "faster-whisper": _faster_whisper,
    "fake": _fake,
}


def create_engine(section: AsrSection) -> AsrEngine:
    """The engine the settings name; an unknown name fails fast with the choices."""
    try:
        factory = ENGINES[section.engine]
    except KeyError:
        choices = ", ".join(sorted(ENGINES))
        raise ValueError(
            f"unknown ASR engine {section.engine!r}; choose one of {choices}"
        ) from None
    return factory(section)
