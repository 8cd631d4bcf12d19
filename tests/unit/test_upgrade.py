"""A WebSocket message sent together with the handshake reaches the app (KeepUpgradeTail)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket

from services.common.service.upgrade import KeepUpgradeTail
from tests.e2e.wire import pipelined
from tests.servers import ServerThread


async def _echo(ws: WebSocket) -> None:
    await ws.accept()
    await ws.send_text("ready")
    await ws.send_text("echo:" + await ws.receive_text())


@pytest.fixture(params=["uvicorn", "keep-tail"])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    app = Starlette(routes=[WebSocketRoute("/ws", _echo)])
    thread = ServerThread(app)  # the services' uvicorn config: KeepUpgradeTail
    assert thread.server.config.http is KeepUpgradeTail
    if request.param == "uvicorn":
        thread.server.config.http = "httptools"  # uvicorn's own protocol
    with thread:
        yield request.param, thread.port


def test_a_message_pipelined_with_the_handshake(server: tuple[str, int]) -> None:
    kind, port = server
    received = pipelined(port, "/ws", b"{{", until=b"echo:")
    assert received.startswith(b"HTTP/1.1 101 ") and b"ready" in received
    # uvicorn's own protocol drops it (the reason for KeepUpgradeTail); ours delivers it
    assert (b"echo:{{" in received) == (kind == "keep-tail")


def test_plain_http_still_works_with_keep_tail() -> None:
    app = Starlette(routes=[WebSocketRoute("/ws", _echo)])
    thread = ServerThread(app)
    with thread, socket.create_connection(("127.0.0.1", thread.port), timeout=2) as sock:
        sock.sendall(b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 404 ")
