"""Real servers for tests: uvicorn on free ports (in threads), real Redis processes."""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn

from services.common.service.server import uvicorn_config
from services.common.service.settings import ServerSettings
from services.ops.redis_server import free_port


class ServerThread:
    """A real uvicorn server for one app, on a free port, in a background thread."""

    def __init__(self, app: Any, port: int | None = None, max_frame_bytes: int = 1 << 20) -> None:
        self.port = port or free_port()
        server = ServerSettings(
            host="127.0.0.1", port=self.port, ws_max_frame_bytes=max_frame_bytes, drain_timeout_s=2
        )
        self.server = uvicorn.Server(uvicorn_config(app, server, "warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server on port {self.port} did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
