"""Start the gateway: `python services/gateway/server.py [--port N]` or `voice-agent gateway`."""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from services.common.service.server import run_service
from services.gateway.app import create_app
from services.gateway.settings import GatewaySettings


def main(argv: list[str] | None = None) -> None:
    """Run the gateway until interrupted."""
    run_service(
        "gateway",
        GatewaySettings,
        create_app,
        lambda settings: settings.gateway.server,
        argv,
        on_stop=lambda app: app.state.drain_on_stop(),  # services/gateway/drain.py
    )


if __name__ == "__main__":
    main()
