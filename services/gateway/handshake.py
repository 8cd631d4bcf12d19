"""The subprotocols of a session endpoint's upgrade (`/v1/stream`, `/v1/realtime`).

The credential a client sends (`Authorization: Bearer`, or a `voice-agent.token.<t>` /
`openai-insecure-api-key.<t>` subprotocol) is read and checked by the auth guard before
any route runs (`services.common.auth.credentials.credential`); this module only says which
subprotocol to answer with. A browser that offers subprotocols fails the connection
unless the server selects one, so the answer is the first offered that is not a token
carrier.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.websockets import WebSocket

from services.common.auth.credentials import TOKEN_SUBPROTOCOLS


@dataclass(frozen=True, slots=True)
class Handshake:
    """What the upgrade request said about the client's subprotocols."""

    subprotocol: str | None
    """The subprotocol to accept with (None when the client offered none)."""
    offered: tuple[str, ...] = ()
    """Every subprotocol the client offered."""


def read_handshake(ws: WebSocket) -> Handshake:
    """The subprotocols of an upgrade request (nothing is checked here)."""
    offered = [p.strip() for p in ws.headers.get("sec-websocket-protocol", "").split(",")]
    offered = [p for p in offered if p]
    chosen = next((p for p in offered if not p.startswith(TOKEN_SUBPROTOCOLS)), None)
    return Handshake(subprotocol=chosen, offered=tuple(offered))
