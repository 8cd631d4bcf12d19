"""Start the TTS service: `python services/tts/server.py [--port N]` or `voice-agent tts`."""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from services.common.service.server import run_service
from services.tts.app import create_app
from services.tts.settings import TtsSettings


def main(argv: list[str] | None = None) -> None:
    """Run the TTS service until interrupted."""
    run_service("tts", TtsSettings, create_app, lambda settings: settings.tts.server, argv)


if __name__ == "__main__":
    main()
