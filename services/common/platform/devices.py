"""Which GPU a model process uses, given its settings and `CUDA_VISIBLE_DEVICES`.

`CUDA_VISIBLE_DEVICES=1` makes the second physical GPU appear as `cuda:0` inside
the process, so a service never asks for `cuda:1` when it can only see one device.
A service's settings may name the *physical* GPU it owns (`gpu`, as nvidia-smi
numbers it): when the environment does not restrict the visible GPUs, the process
pins itself to that GPU (before CUDA initializes) and uses `cuda:0`; when it does,
the physical GPU must be among the visible ones and its position there is used.
Without `gpu`, `device_index` counts among the visible GPUs, as CUDA does.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass

from services.common.errors import EngineUnavailable

VISIBLE = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True, slots=True)
class GpuChoice:
    """The device index to use inside this process and the pin to apply, if any."""

    index: int
    pin: str | None = None


def visible_gpus(visible: str) -> list[int | str]:
    """`CUDA_VISIBLE_DEVICES` as CUDA reads it: physical indices and `GPU-`/`MIG-` UUIDs,
    up to the first invalid entry ("-1", "", garbage), where CUDA stops reading."""
    ids: list[int | str] = []
    for part in (p.strip() for p in visible.split(",")):
        if part.isdigit():
            ids.append(int(part))
        elif part.startswith(("GPU-", "MIG-")):
            ids.append(part)
        else:
            break
    return ids


def choose_gpu(
    physical: int | None, device_index: int, visible: str | None, setting: str
) -> GpuChoice:
    """Map the settings onto what this process can see; `setting` names the env var to fix."""
    if physical is None:
        return GpuChoice(device_index)
    if visible is None:
        return GpuChoice(0, str(physical))
    ids = visible_gpus(visible)
    if physical in ids:
        return GpuChoice(ids.index(physical))
    raise EngineUnavailable(
        f"{setting}={physical} but this process sees only GPUs {VISIBLE}={visible!r}: "
        f"unset {VISIBLE}, include {physical} in it, or unset {setting}"
    )


def pin_gpu(
    physical: int | None, device_index: int, environ: MutableMapping[str, str], setting: str
) -> int:
    """Choose the GPU, pin `CUDA_VISIBLE_DEVICES` if needed; the index to use in-process.

    Call it before anything in the process initializes CUDA, or the pin has no effect.
    """
    choice = choose_gpu(physical, device_index, environ.get(VISIBLE), setting)
    if choice.pin is not None:
        environ[VISIBLE] = choice.pin
    return choice.index


def cuda_index(device: str) -> int | None:
    """The index in a device string (`cuda:1` → 1); None for `cpu`."""
    kind, _, index = device.partition(":")
    if kind != "cuda":
        return None
    return int(index) if index.isdigit() else 0
