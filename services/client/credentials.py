"""The credential a command-line client sends, and what a refusal of it means.

`voice-agent client` and `voice-agent loadtest` take the API key (or client token) from
`VA_API_KEY`: never from a flag, so it is in neither `ps` nor the shell history.
"""

from __future__ import annotations

import os

import websockets


def api_key_from_env() -> str | None:
    return os.environ.get("VA_API_KEY") or None


def bearer(api_key: str | None) -> dict[str, str]:
    """The header that carries `api_key` (none without one)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def refusal(exc: Exception, url: str, api_key: str | None) -> str | None:
    """Why a gateway refused a WebSocket upgrade, in one line; None when it did not."""
    if not isinstance(exc, websockets.InvalidStatus):
        return None
    status = exc.response.status_code
    if status in (401, 403):
        held = "was refused" if api_key else "is not set"
        return (
            f"the gateway at {url} refused the connection ({status}): VA_API_KEY {held}; "
            "set it to an API key or client token (docs/auth.md)"
        )
    return f"the gateway at {url} refused the connection with HTTP {status}"
