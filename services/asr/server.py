"""Start the ASR service: `python services/asr/server.py [--port N]` or `voice-agent asr`."""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from services.asr.app import create_app
from services.asr.settings import AsrSettings
from services.common.service.server import run_service


def main(argv: list[str] | None = None) -> None:
    """Run the ASR service until interrupted."""
    run_service("asr", AsrSettings, create_app, lambda settings: settings.asr.server, argv)


if __name__ == "__main__":
    main()
