"""Duplex engines by name. Factories import their model library only when chosen."""

from __future__ import annotations

from collections.abc import Callable

from services.duplex.engines.base import DuplexEngine
from services.duplex.settings import DuplexSection


def _moshi(section: DuplexSection) -> DuplexEngine:
    from services.duplex.engines.moshi import checkpoint_engine

    return checkpoint_engine(section)


def _moshi_random(section: DuplexSection) -> DuplexEngine:
    from services.duplex.engines.moshi import random_engine

    return random_engine(section)


def _fake(section: DuplexSection) -> DuplexEngine:
    from services.duplex.engines.fake import FakeDuplexEngine

    return FakeDuplexEngine(section.fake)


ENGINES: dict[str, Callable[[DuplexSection], DuplexEngine]] = {
    "moshi": _moshi,
    "moshi-random": _moshi_random,
    "fake": _fake,
}


def create_engine(section: DuplexSection) -> DuplexEngine:
    """The engine the settings name; an unknown name fails fast with the choices."""
    try:
        factory = ENGINES[section.engine]
    except KeyError:
        choices = ", ".join(sorted(ENGINES))
        raise ValueError(
            f"unknown duplex engine {section.engine!r}; choose one of {choices}"
        ) from None
    return factory(section)
