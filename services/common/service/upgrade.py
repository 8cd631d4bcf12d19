"""uvicorn's HTTP protocol, but a WebSocket's first frames sent with its handshake survive.

uvicorn's HTTP protocols hand the WebSocket protocol the upgrade request rebuilt from its
parsed headers and drop whatever followed it in the same read. A client that sends its
first message without waiting for the `101` (RFC 6455 says it must wait; some do not)
lost that message in silence: no `error`, no close, a client waiting forever. This
protocol passes those bytes on, so they are parsed as frames like any later ones. Use it
as uvicorn's `http` (`uvicorn.Config(http=KeepUpgradeTail)`).
"""

from __future__ import annotations

import asyncio
import sys

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class KeepUpgradeTail(HttpToolsProtocol):
    """HttpToolsProtocol that forwards the bytes after an upgrade request to the WebSocket."""

    _received = b""

    def data_received(self, data: bytes) -> None:
        self._received = data
        try:
            super().data_received(data)
        finally:
            self._received = b""

    def handle_websocket_upgrade(self) -> None:
        # Called while uvicorn handles httptools' HttpParserUpgrade, which says where the
        # request ended in this read.
        upgrade = sys.exception()
        tail = b""
        if isinstance(upgrade, httptools.HttpParserUpgrade) and upgrade.args:
            tail = self._received[upgrade.args[0] :]
        super().handle_websocket_upgrade()
        websocket = self.transport.get_protocol()
        if tail and isinstance(websocket, asyncio.Protocol):
            websocket.data_received(tail)
