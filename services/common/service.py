"""What every service shares at the HTTP edge: /health, /ready, /metrics, error mapping."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from redis.asyncio import Redis

from services.common import metrics
from services.common.errors import CapacityError, VoiceAgentError
from services.common.gpu import gpu_report

log = logging.getLogger(__name__)


@dataclass
class ServiceState:
    """The live facts one service reports on /health and /ready."""

    service: str
    redis: Redis
    engine: str = ""
    model: str = ""
    device: str = "cpu"
    gpu_index: int | None = None
    model_loaded: bool = False
    draining: bool = False
    active_connections: int = 0
    queue_depth: Callable[[], int] = lambda: 0
    started_at: float = field(default_factory=time.time)
    extra: Callable[[], dict[str, Any]] = dict

    def connection_opened(self) -> None:
        self.active_connections += 1
        metrics.ACTIVE_CONNECTIONS.labels(self.service).set(self.active_connections)

    def connection_closed(self) -> None:
        self.active_connections -= 1
        metrics.ACTIVE_CONNECTIONS.labels(self.service).set(self.active_connections)

    async def redis_ok(self) -> bool:
        try:
            return bool(await self.redis.ping())
        except Exception:
            return False

    def health(self, redis_ok: bool) -> dict[str, Any]:
        depth = self.queue_depth()
        metrics.QUEUE_DEPTH.labels(self.service).set(depth)
        report: dict[str, Any] = {
            "status": "healthy",
            "service": self.service,
            "engine": self.engine,
            "model": self.model,
            "device": self.device,
            "model_loaded": self.model_loaded,
            "redis": "ok" if redis_ok else "unreachable",
            "draining": self.draining,
            "active_connections": self.active_connections,
            "queue_depth": depth,
            "queue_size": depth,
            "uptime_s": round(time.time() - self.started_at, 3),
        }
        if self.gpu_index is not None:
            gpu = gpu_report(self.gpu_index)
            report["gpu"] = gpu
            if gpu.get("available"):
                label = str(gpu["id"])
                metrics.GPU_UTILIZATION.labels(self.service, label).set(gpu["utilization"])
                metrics.GPU_MEMORY_USED.labels(self.service, label).set(gpu["memory_allocated"])
                metrics.GPU_MEMORY_TOTAL.labels(self.service, label).set(gpu["memory_total"])
        report.update(self.extra())
        return report


def error_body(exc: VoiceAgentError) -> dict[str, Any]:
    """The JSON error body of REST endpoints (OpenAI's shape, our code)."""
    return {"error": {"message": exc.message, "type": exc.code, "code": exc.code}}


def install_ops(app: FastAPI, state: ServiceState) -> None:
    """Add /health, /ready, /metrics and the domain-error → HTTP mapping to an app."""

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return state.health(await state.redis_ok())

    @app.get("/ready")
    async def ready() -> JSONResponse:
        redis_ok = await state.redis_ok()
        checks = {
            "model_loaded": state.model_loaded,
            "redis": redis_ok,
            "not_draining": not state.draining,
        }
        is_ready = all(checks.values())
        metrics.READY.labels(state.service).set(1 if is_ready else 0)
        return JSONResponse({"ready": is_ready, "checks": checks}, 200 if is_ready else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    @app.exception_handler(VoiceAgentError)
    async def domain_error(_: Request, exc: VoiceAgentError) -> JSONResponse:
        metrics.ERRORS.labels(state.service, exc.code).inc()
        headers = (
            {"Retry-After": str(max(1, round(exc.retry_after_s)))}
            if isinstance(exc, CapacityError)
            else None
        )
        return JSONResponse(error_body(exc), exc.http_status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        metrics.ERRORS.labels(state.service, "invalid_message").inc()
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in first.get("loc", ())[1:])
        message = f"{where}: {first.get('msg')}" if where else str(first.get("msg"))
        body = {"error": {"message": message, "type": "invalid_message", "code": "invalid_message"}}
        return JSONResponse(body, 400)
