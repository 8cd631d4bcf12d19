"""GPU facts on /health and /metrics: CUDA_VISIBLE_DEVICES mapping, NVML (faked), CPU hosts."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client import REGISTRY

from services.common.platform import gpu
from services.common.platform.gpu import gpu_report, physical_index
from services.common.service.routes import ServiceState, install_ops
from tests.fake_nvml import FakeNvml, nvml_installed, two_gpus

SEED_GPU_FIELDS = {"id", "name", "available", "memory_allocated", "memory_reserved", "memory_total"}
SEED_FIELDS = {"status", "gpu", "active_connections", "queue_size"}


@pytest.mark.parametrize(
    ("visible", "index", "expected"),
    [
        (None, 0, 0),  # unset: CUDA sees every GPU in NVML's order
        (None, 1, 1),
        ("1", 0, 1),  # the TTS unit: physical GPU 1 is cuda:0 inside
        ("0", 0, 0),
        ("2,0", 0, 2),
        ("2,0", 1, 0),
        (" 3 , 1 ", 1, 1),
        ("1", 1, None),  # only one GPU is visible
        ("", 0, None),  # set but empty hides every GPU
        ("-1", 0, None),
        ("0,-1,1", 1, None),  # CUDA stops at the first invalid entry
        ("GPU-8f2c1d3e", 0, "GPU-8f2c1d3e"),
        ("MIG-4a5b", 0, "MIG-4a5b"),
    ],
)
def test_physical_index_follows_cuda_visible_devices(
    visible: str | None, index: int, expected: int | str | None
) -> None:
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    assert physical_index(index, env) == expected


def test_physical_index_reads_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert physical_index(0) == 1
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert physical_index(0) == 0


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNvml]:
    fake = two_gpus()
    with nvml_installed(monkeypatch, fake):
        yield fake


def test_report_names_the_physical_gpu_behind_the_visible_one(nvml: FakeNvml) -> None:
    nvml.gpus[1].processes = {os.getpid(): 3 << 30, 999_999: 7 << 30}
    report = gpu_report(0, env={"CUDA_VISIBLE_DEVICES": "1"})
    assert report.keys() >= SEED_GPU_FIELDS
    assert report == {
        "id": 1,
        "name": "NVIDIA RTX A6000",
        "available": True,
        "memory_allocated": 3 << 30,  # this process's share
        "memory_reserved": 10 << 30,  # the whole GPU's use
        "memory_total": 48 << 30,
        "utilization": 0.8,
        "temperature_c": 60,
    }
    by_uuid = gpu_report(0, env={"CUDA_VISIBLE_DEVICES": "GPU-1111"})
    assert by_uuid["name"] == "NVIDIA RTX A6000" and by_uuid["id"] == "GPU-1111"


def test_report_without_per_process_accounting_or_utilization(nvml: FakeNvml) -> None:
    nvml.gpus[0].utilization = None  # e.g. a MIG slice
    report = gpu_report(0, env={})
    assert report["available"] is True
    assert report["memory_allocated"] == report["memory_reserved"] == 4 << 30
    assert report["utilization"] is None


def test_nvml_is_initialised_once_per_process(nvml: FakeNvml) -> None:
    for _ in range(3):
        gpu_report(0, env={})
    assert gpu.gpu_count() == 2
    assert nvml.init_calls == 1
    gpu.reset()
    assert nvml.shutdown_calls == 1


def test_wrong_gpu_is_unavailable_not_an_error(nvml: FakeNvml) -> None:
    report = gpu_report(0, env={"CUDA_VISIBLE_DEVICES": "7"})
    assert report["available"] is False and report["id"] == 7
    assert "NVML error" in report["reason"]
    hidden = gpu_report(0, env={"CUDA_VISIBLE_DEVICES": ""})
    assert hidden["available"] is False and "not visible" in hidden["reason"]


@pytest.mark.parametrize("installed", [False, True])
def test_cpu_host_reports_unavailable_cleanly(
    monkeypatch: pytest.MonkeyPatch, installed: bool
) -> None:
    """No nvidia-ml-py, or one without a driver to talk to: available false, once."""
    broken = FakeNvml([], init_error=OSError("NVML Shared Library Not Found"))
    with nvml_installed(monkeypatch, broken if installed else None):
        first = gpu_report(0, env={})
        second = gpu_report(0, env={})
        assert gpu.gpu_count() == 0
    assert first == second
    assert first["available"] is False and first["reason"].startswith("NVML unavailable")
    assert SEED_GPU_FIELDS - {"memory_allocated", "memory_reserved", "memory_total"} <= set(first)
    assert broken.init_calls == (1 if installed else 0)


class FakeRedis:
    def __init__(self, answer: bool | Exception | None = True) -> None:
        self.answer = answer  # None: never answers

    async def ping(self) -> bool:
        if self.answer is None:
            await asyncio.sleep(3600)
        if isinstance(self.answer, Exception):
            raise self.answer
        return bool(self.answer)


def app_for(state: ServiceState) -> FastAPI:
    app = FastAPI()
    install_ops(app, state)
    return app


async def get(app: FastAPI, path: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return await client.get(path)


def gauge(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


async def test_health_has_the_seed_fields_and_fills_the_gpu_gauges(nvml: FakeNvml) -> None:
    state = ServiceState(
        "tts",
        FakeRedis(),
        engine="chatterbox",
        device="cuda:0",
        gpu_index=0,  # type: ignore[arg-type]
    )
    state.model_loaded = True
    state.queue_depth = lambda: 3
    with pytest.MonkeyPatch.context() as env:
        env.setenv("CUDA_VISIBLE_DEVICES", "1")
        body = (await get(app_for(state), "/health")).json()
        metrics_text = (await get(app_for(state), "/metrics")).text
    assert body.keys() >= SEED_FIELDS and body["gpu"].keys() >= SEED_GPU_FIELDS
    assert body["status"] == "healthy" and body["queue_size"] == body["queue_depth"] == 3
    assert body["gpu"]["id"] == 1 and body["gpu"]["available"] is True
    assert gauge("va_gpu_utilization_ratio", service="tts", gpu="1") == 0.8
    assert gauge("va_gpu_memory_used_bytes", service="tts", gpu="1") == 10 << 30
    assert gauge("va_gpu_memory_total_bytes", service="tts", gpu="1") == 48 << 30
    assert 'va_queue_depth{service="tts"} 3.0' in metrics_text
    assert 'va_ready{service="tts"} 1.0' in metrics_text


async def test_cpu_service_reports_gpu_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = FakeNvml([])
    with nvml_installed(monkeypatch, broken):
        state = ServiceState("gateway", FakeRedis())  # type: ignore[arg-type]
        body = (await get(app_for(state), "/health")).json()
    assert body["gpu"]["available"] is False and body["gpu"]["id"] is None
    assert "cpu" in body["gpu"]["reason"]
    assert broken.init_calls == 0  # a CPU service never touches NVML


@pytest.mark.parametrize(
    ("loaded", "redis", "draining", "failing"),
    [
        (True, FakeRedis(True), False, None),
        (False, FakeRedis(True), False, "model_loaded"),
        (True, FakeRedis(ConnectionError("down")), False, "redis"),
        (True, FakeRedis(None), False, "redis"),  # a Redis that hangs: /ready still answers
        (True, FakeRedis(True), True, "not_draining"),
        (True, FakeRedis(True), False, "background"),  # a job worker waits for its restart
    ],
)
async def test_ready_follows_the_protocol(
    loaded: bool, redis: Any, draining: bool, failing: str | None
) -> None:
    """docs/protocol.md: 200 only when the model is loaded, Redis reachable, not draining,
    and every background task running."""
    state = ServiceState("asr", redis, model_loaded=loaded, draining=draining)
    state.background_ok = lambda: failing != "background"
    app = app_for(state)
    async with asyncio.timeout(5):
        response = await get(app, "/ready")
        health = await get(app, "/health")
    assert response.status_code == (200 if failing is None else 503)
    checks = response.json()["checks"]
    assert [name for name, ok in checks.items() if not ok] == ([failing] if failing else [])
    assert health.status_code == 200  # liveness holds whatever readiness says
    assert gauge("va_ready", service="asr") == (1.0 if failing is None else 0.0)
