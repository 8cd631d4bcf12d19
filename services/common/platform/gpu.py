"""GPU facts through NVML (nvidia-ml-py), so no service needs torch to report them.

`CUDA_VISIBLE_DEVICES` renumbers GPUs inside a process; NVML does not. A service
that owns the `index`-th visible GPU reports the physical GPU behind it. NVML numbers
GPUs in PCI bus order, as `nvidia-smi` does; CUDA does so only with
`CUDA_DEVICE_ORDER=PCI_BUS_ID` (the systemd units set it; CUDA's default is
"fastest first", which can differ on a host with unlike GPUs).

NVML is initialised once per process, on first use, and a host without a driver is
remembered as such: /health and /metrics stay cheap on CPU hosts and GPU hosts alike.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

from services.common.platform.devices import VISIBLE, visible_gpus

log = logging.getLogger(__name__)

_lock = threading.Lock()
_nvml: dict[str, Any] = {}
"""`module`: the initialised pynvml module, or `error`: why NVML is unavailable."""


def physical_index(visible_index: int, env: Mapping[str, str] | None = None) -> int | str | None:
    """The NVML index (or UUID) of the `visible_index`-th GPU this process can see.

    None when the process cannot see that many GPUs: `CUDA_VISIBLE_DEVICES` set but
    empty hides them all, and CUDA stops reading the list at its first invalid entry.
    """
    visible = (os.environ if env is None else env).get(VISIBLE)
    if visible is None:
        return visible_index
    ids = visible_gpus(visible)
    return ids[visible_index] if visible_index < len(ids) else None


def _module() -> Any:
    """The initialised pynvml module; RuntimeError (remembered) when NVML is unavailable."""
    with _lock:
        if "module" in _nvml:
            return _nvml["module"]
        if "error" not in _nvml:
            try:
                import pynvml

                pynvml.nvmlInit()
            except Exception as exc:  # no library, no driver: a CPU host
                _nvml["error"] = f"NVML unavailable: {exc or type(exc).__name__}"
            else:
                _nvml["module"] = pynvml
                return pynvml
        raise RuntimeError(_nvml["error"])


def reset() -> None:
    """Forget NVML's state (shut it down if initialised); the next call initialises again."""
    with _lock:
        module = _nvml.pop("module", None)
        _nvml.pop("error", None)
    if module is not None:
        try:
            module.nvmlShutdown()
        except Exception:
            log.debug("nvmlShutdown failed", exc_info=True)


def gpu_count() -> int:
    """How many GPUs NVML sees on the host (0 without a driver)."""
    try:
        return int(_module().nvmlDeviceGetCount())
    except Exception:
        return 0


def _process_memory(nvml: Any, handle: Any) -> int | None:
    """Bytes this process holds on the GPU, when NVML's per-process accounting knows it."""
    try:
        processes = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception:
        return None
    pid = os.getpid()
    for process in processes:
        used = getattr(process, "usedGpuMemory", None)
        if process.pid == pid and isinstance(used, int):
            return used
    return None  # not listed: no context yet, or another PID namespace (a container)


def _utilization(nvml: Any, handle: Any) -> float | None:
    try:
        return float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu) / 100.0
    except Exception:  # not supported (MIG slices, some boards)
        return None


def _temperature(nvml: Any, handle: Any) -> int | None:
    try:
        return int(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
    except Exception:
        return None


def _describe(nvml: Any, target: int | str) -> dict[str, Any]:
    handle = (
        nvml.nvmlDeviceGetHandleByIndex(target)
        if isinstance(target, int)
        else nvml.nvmlDeviceGetHandleByUUID(target)
    )
    name = nvml.nvmlDeviceGetName(handle)
    mem = nvml.nvmlDeviceGetMemoryInfo(handle)
    mine = _process_memory(nvml, handle)
    return {
        "id": target,
        "name": name.decode() if isinstance(name, bytes) else str(name),
        "available": True,
        "memory_allocated": int(mem.used) if mine is None else mine,
        "memory_reserved": int(mem.used),
        "memory_total": int(mem.total),
        "utilization": _utilization(nvml, handle),
        "temperature_c": _temperature(nvml, handle),
    }


def gpu_report(visible_index: int, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """One GPU's facts for /health; `available: False` with a reason when there is none.

    `memory_allocated`: bytes this process holds (the whole GPU's use when NVML cannot
    tell per process); `memory_reserved`: bytes in use on the GPU by all processes;
    `memory_total`: the GPU's memory; `utilization`: 0-1 over NVML's last sample window.
    """
    target = physical_index(visible_index, env)
    if target is None:
        visible = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
        reason = f"GPU {visible_index} is not visible (CUDA_VISIBLE_DEVICES={visible!r})"
        return {"id": None, "name": None, "available": False, "reason": reason}
    try:
        nvml = _module()
    except RuntimeError as exc:
        return {"id": target, "name": None, "available": False, "reason": str(exc)}
    try:
        return _describe(nvml, target)
    except Exception as exc:  # a wrong index or UUID, a GPU fallen off the bus
        return {"id": target, "name": None, "available": False, "reason": f"NVML error: {exc}"}
