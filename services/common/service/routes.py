"""What every service shares at the HTTP edge: /health, /ready, /metrics, error mapping."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Query, Request, WebSocket
from fastapi.exceptions import RequestValidationError, WebSocketRequestValidationError
from fastapi.responses import JSONResponse, Response
from redis.asyncio import Redis
from starlette.exceptions import HTTPException

from services.common import metrics
from services.common.audio.pcm import ALLOWED_SAMPLE_RATES
from services.common.auth.guard import BRIEF_HEALTH, retry_headers
from services.common.body_limit import TooLarge
from services.common.errors import (
    InternalError,
    InvalidMessage,
    UnsupportedSampleRate,
    VoiceAgentError,
)
from services.common.platform.gpu import gpu_report
from services.common.service.process import LoopLagMonitor, RecentSamples, process_figures
from services.common.service.ws import Channel

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
    background_ok: Callable[[], bool] = lambda: True
    """Whether the service's background tasks all run (lifecycle.Background.healthy): a
    job worker or result reader that died and waits for its restart is not serving."""
    started_at: float = field(default_factory=time.time)
    extra: Callable[[], dict[str, Any]] = dict
    timings: dict[str, RecentSamples] = field(default_factory=dict)
    """Durations the service reports on /health (`timings_ms`), over the lag window."""
    loop_lag: LoopLagMonitor = field(init=False)

    def __post_init__(self) -> None:
        self.loop_lag = LoopLagMonitor(self.service)

    def connection_opened(self) -> None:
        self.active_connections += 1
        metrics.ACTIVE_CONNECTIONS.labels(self.service).set(self.active_connections)

    def connection_closed(self) -> None:
        self.active_connections -= 1
        metrics.ACTIVE_CONNECTIONS.labels(self.service).set(self.active_connections)

    async def redis_ok(self, timeout_s: float = 1.0) -> bool:
        """Whether Redis answers PING within `timeout_s` (so /ready never hangs on it)."""
        try:
            async with asyncio.timeout(timeout_s):
                return bool(await self.redis.ping())
        except Exception:
            return False

    def readiness(self, redis_ok: bool) -> dict[str, bool]:
        """The checks /ready reports; ready when all hold (docs/protocol.md). Sets `va_ready`."""
        checks = {
            "model_loaded": self.model_loaded,
            "redis": redis_ok,
            "not_draining": not self.draining,
            "background": self.background_ok(),
        }
        metrics.READY.labels(self.service).set(1 if all(checks.values()) else 0)
        return checks

    def gpu(self) -> dict[str, Any]:
        """The service's GPU (`available: False` on CPU); updates the GPU gauges. Blocking."""
        if self.gpu_index is None:
            reason = f"the service runs on {self.device}"
            return {"id": None, "name": None, "available": False, "reason": reason}
        gpu = gpu_report(self.gpu_index)
        if gpu["available"]:
            label = str(gpu["id"])
            if gpu.get("utilization") is not None:
                metrics.GPU_UTILIZATION.labels(self.service, label).set(gpu["utilization"])
            metrics.GPU_MEMORY_USED.labels(self.service, label).set(gpu["memory_reserved"])
            metrics.GPU_MEMORY_TOTAL.labels(self.service, label).set(gpu["memory_total"])
        return gpu

    def health(
        self, redis_ok: bool, gpu: dict[str, Any], lag_window_s: float = 60.0
    ) -> dict[str, Any]:
        """The /health report (the fields seed deployments poll included); the event-loop
        lag is over the last `lag_window_s` seconds."""
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
            "gpu": gpu,
            "event_loop_lag_ms": self.loop_lag.summary(lag_window_s),
            "process": process_figures(),
        }
        if self.timings:
            report["timings_ms"] = {
                name: samples.summary(lag_window_s) for name, samples in self.timings.items()
            }
        report.update(self.extra())
        return report

    async def refresh_gauges(self) -> None:
        """Bring the gauges a scrape reads up to date: queue depth, readiness, GPU."""
        self.readiness(await self.redis_ok())
        metrics.QUEUE_DEPTH.labels(self.service).set(self.queue_depth())
        await asyncio.to_thread(self.gpu)


def _first_problem(errors: Sequence[Any]) -> tuple[str, str]:
    """(where, what) of the first validation error, e.g. ("sample_rate", "Input should be...")."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    return ".".join(str(p) for p in first.get("loc", ())[1:]), str(first.get("msg"))


def http_exception_error(exc: HTTPException) -> VoiceAgentError:
    """Starlette's own refusals (unknown route 404, wrong method 405, unreadable body 400)
    as typed errors, so every HTTP error has the same JSON shape."""
    if isinstance(exc, TooLarge):  # a body past its limit (BodyLimit)
        return exc.error
    error = (
        InvalidMessage(str(exc.detail))
        if exc.status_code < 500
        else VoiceAgentError(str(exc.detail))
    )
    error.http_status = exc.status_code
    return error


def query_error(errors: Sequence[Any]) -> VoiceAgentError:
    """A WebSocket query that failed validation, as the fatal typed error it is (close 1008)."""
    where, what = _first_problem(errors)
    message = f"query parameter {where}: {what}" if where else what
    error: VoiceAgentError = InvalidMessage(message)
    if where.endswith("sample_rate"):
        allowed = ", ".join(str(r) for r in ALLOWED_SAMPLE_RATES)
        error = UnsupportedSampleRate(f"{message}; use one of {allowed}")
    error.fatal, error.close_code = True, 1008
    return error


def run_for_app_life(app: FastAPI, monitor: LoopLagMonitor) -> None:
    """Wrap the app's lifespan so `monitor` runs from before start-up to after shutdown."""
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(target: Any) -> AsyncIterator[Any]:
        async with monitor.running(), inner(target) as lifespan_state:
            yield lifespan_state

    app.router.lifespan_context = lifespan


def install_ops(app: FastAPI, state: ServiceState) -> None:
    """Add /health, /ready, /metrics and the domain-error → HTTP mapping to an app, and run
    its event-loop lag monitor for the app's life."""
    run_for_app_life(app, state.loop_lag)

    @app.get("/health")
    async def health(
        request: Request,
        window_s: float = Query(60.0, gt=0, le=600, description="event-loop lag window"),
    ) -> dict[str, Any]:
        if request.scope.get(BRIEF_HEALTH):  # `protect_ops` and no credential
            return {"status": "healthy", "service": state.service}
        redis_ok = await state.redis_ok()
        return state.health(redis_ok, await asyncio.to_thread(state.gpu), window_s)

    @app.get("/ready")
    async def ready() -> JSONResponse:
        checks = state.readiness(await state.redis_ok())
        is_ready = all(checks.values())
        return JSONResponse({"ready": is_ready, "checks": checks}, 200 if is_ready else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        await state.refresh_gauges()
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    def reply(
        request: Request, exc: VoiceAgentError, headers: Mapping[str, str] | None = None
    ) -> JSONResponse:
        metrics.ERRORS.labels(state.service, exc.code).inc()
        route = metrics.REST_ROUTES.get((state.service, request.scope.get("path", "")))
        if route is not None:  # a counted request's error outcome (its ok: where it is served)
            metrics.REQUESTS.labels(state.service, route, "error").inc()
        return JSONResponse(exc.body(), exc.http_status, headers=headers)

    @app.exception_handler(VoiceAgentError)
    async def domain_error(request: Request, exc: VoiceAgentError) -> JSONResponse:
        return reply(request, exc, retry_headers(exc))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        where, what = _first_problem(exc.errors())
        return reply(request, InvalidMessage(f"{where}: {what}" if where else what))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return reply(request, http_exception_error(exc), exc.headers)

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
        # The server still logs the traceback; the client gets the JSON shape, no details.
        return reply(request, InternalError.of(exc))

    @app.exception_handler(WebSocketRequestValidationError)
    async def ws_validation_error(ws: WebSocket, exc: WebSocketRequestValidationError) -> None:
        # Accept, so the client reads a typed error instead of a bare HTTP 403 handshake.
        await ws.accept()
        await Channel(ws, state.service, max_frame_bytes=0).fail(query_error(exc.errors()))
