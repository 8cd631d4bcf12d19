"""Start the duplex service: `python services/duplex/server.py [--port N]` or
`voice-agent duplex` (from the duplex environment, .venv-duplex: docs/duplex.md)."""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from services.common.service.server import run_service
from services.duplex.app import create_app
from services.duplex.settings import DuplexSettings


def main(argv: list[str] | None = None) -> None:
    """Run the duplex service until interrupted."""
    run_service("duplex", DuplexSettings, create_app, lambda settings: settings.duplex.server, argv)


if __name__ == "__main__":
    main()
