"""GPU facts through NVML (nvidia-ml-py), so no service needs torch to report them.

`CUDA_VISIBLE_DEVICES` renumbers GPUs inside a process; NVML does not. A service
that owns the `index`-th visible GPU reports the physical GPU behind it.
"""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger(__name__)


def physical_index(visible_index: int, env: dict[str, str] | None = None) -> int | str:
    """The NVML index (or UUID) of the `visible_index`-th GPU this process can see."""
    visible = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES", "").strip()
    if not visible:
        return visible_index
    ids = [part.strip() for part in visible.split(",") if part.strip()]
    if visible_index >= len(ids):
        return visible_index
    chosen = ids[visible_index]
    return int(chosen) if chosen.isdigit() else chosen


def gpu_report(visible_index: int) -> dict[str, Any]:
    """Name, availability and memory of one GPU; `available: False` with a reason if none."""
    target = physical_index(visible_index)
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # no driver, no library: a CPU host
        return {"id": target, "available": False, "reason": f"NVML unavailable: {exc}"}
    try:
        handle = (
            pynvml.nvmlDeviceGetHandleByIndex(target)
            if isinstance(target, int)
            else pynvml.nvmlDeviceGetHandleByUUID(target)
        )
        name = pynvml.nvmlDeviceGetName(handle)
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
        util = pynvml.nvmlDeviceGetUtilizationRates(handle)
        return {
            "id": target,
            "name": name.decode() if isinstance(name, bytes) else str(name),
            "available": True,
            "memory_allocated": int(mem.used),
            "memory_reserved": int(mem.used),
            "memory_total": int(mem.total),
            "utilization": float(util.gpu) / 100.0,
        }
    except Exception as exc:
        return {"id": target, "available": False, "reason": f"NVML error: {exc}"}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            log.debug("nvmlShutdown failed", exc_info=True)
