"""The WebSocket handshake shared by every session endpoint (`/v1/stream`, `/v1/realtime`).

A client's credential arrives one of three ways, read here and nowhere else:
- `Authorization: Bearer <token>` (servers, the `openai` SDK);
- a subprotocol `voice-agent.token.<token>` (browsers cannot set headers on a WebSocket;
  the page offers `["voice-agent.v1", "voice-agent.token.<token>"]`);
- a subprotocol `openai-insecure-api-key.<token>` (OpenAI's own browser convention, where
  `openai-beta.realtime-v1` asks for the beta event names).
Tokens never travel in the URL (it ends up in access logs).

A browser that offers subprotocols fails the connection unless the server selects one,
so the server answers with the first offered that is not a token carrier.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.websockets import WebSocket

TOKEN_PREFIXES = ("voice-agent.token.", "openai-insecure-api-key.")


@dataclass(frozen=True, slots=True)
class Handshake:
    """What the upgrade request said about the client."""

    credential: str | None
    """The bearer token, from the header or a token subprotocol; None when absent."""
    subprotocol: str | None
    """The subprotocol to accept with (None when the client offered none)."""
    offered: tuple[str, ...] = ()
    """Every subprotocol the client offered."""


def _is_token(protocol: str) -> bool:
    return protocol.startswith(TOKEN_PREFIXES)


def read_handshake(ws: WebSocket) -> Handshake:
    """The credential and subprotocol of an upgrade request (nothing is checked here)."""
    offered = [p.strip() for p in ws.headers.get("sec-websocket-protocol", "").split(",")]
    offered = [p for p in offered if p]
    credential: str | None = None
    scheme, _, token = ws.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        credential = token.strip()
    else:
        for protocol in offered:
            for prefix in TOKEN_PREFIXES:
                if protocol.startswith(prefix) and len(protocol) > len(prefix):
                    credential = protocol[len(prefix) :]
    chosen = next((p for p in offered if not _is_token(p)), None)
    return Handshake(credential=credential, subprotocol=chosen, offered=tuple(offered))
