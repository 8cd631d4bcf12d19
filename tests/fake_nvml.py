"""A stand-in for the `pynvml` module (nvidia-ml-py): GPUs described in Python."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

from services.common.platform import gpu


class NVMLError(Exception):
    """What pynvml raises."""


@dataclass
class FakeGpu:
    name: str = "NVIDIA GeForce RTX 3090"
    total: int = 24 << 30
    used: int = 4 << 30
    utilization: int | None = 25
    temperature: int = 45
    uuid: str = ""
    processes: dict[int, int] = field(default_factory=dict)
    """pid → bytes that process holds."""


class FakeNvml(types.ModuleType):
    NVML_TEMPERATURE_GPU = 0
    NVMLError = NVMLError

    def __init__(self, gpus: list[FakeGpu], init_error: Exception | None = None) -> None:
        super().__init__("pynvml")
        self.gpus = gpus
        self.init_error = init_error
        self.init_calls = 0
        self.shutdown_calls = 0

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        if not 0 <= index < len(self.gpus):
            raise NVMLError("Invalid Argument")
        return self.gpus[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeGpu:
        for device in self.gpus:
            if device.uuid == uuid:
                return device
        raise NVMLError("Not Found")

    def nvmlDeviceGetName(self, handle: FakeGpu) -> bytes:
        return handle.name.encode()  # older nvidia-ml-py returns bytes

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> types.SimpleNamespace:
        return types.SimpleNamespace(
            total=handle.total, used=handle.used, free=handle.total - handle.used
        )

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> types.SimpleNamespace:
        if handle.utilization is None:
            raise NVMLError("Not Supported")
        return types.SimpleNamespace(gpu=handle.utilization, memory=10)

    def nvmlDeviceGetTemperature(self, handle: FakeGpu, sensor: int) -> int:
        return handle.temperature

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeGpu) -> list[object]:
        return [types.SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in handle.processes.items()]


@contextmanager
def nvml_installed(
    monkeypatch: pytest.MonkeyPatch, nvml: types.ModuleType | None
) -> Iterator[None]:
    """Make `import pynvml` give `nvml` (None: as if not installed) inside the block."""
    gpu.reset()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    try:
        yield
    finally:
        gpu.reset()  # sys.modules is restored by monkeypatch at teardown


def two_gpus() -> FakeNvml:
    """GPU 0: an RTX 3090 (4 of 24 GiB used, 25 %); GPU 1: an A6000 (10 of 48 GiB, 80 %)."""
    return FakeNvml(
        [
            FakeGpu(uuid="GPU-0000"),
            FakeGpu("NVIDIA RTX A6000", 48 << 30, 10 << 30, 80, 60, "GPU-1111"),
        ]
    )
