"""Deployment profiles: one setting (`VA_PROFILE`) that changes several defaults at once.

A profile only fills in what the operator left unset: a field given explicitly (by
the environment or by code) always wins. `lite` changes nothing; the others are
applied by each service's settings: `dual-gpu` (ASR: faster-whisper on physical GPU 0;
TTS: chatterbox on physical GPU 1), `fake` (both services' instant fake engines, so
a load test measures what the gateway and Redis add; the duplex service's echo engine)
and `duplex` (the duplex service's `moshi` engine on CUDA, physical GPU 0; the ASR and
TTS services keep their lite engines).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel

from services.common.service.settings import EngineSection, Profile

M = TypeVar("M", bound=BaseModel)
S = TypeVar("S", bound=EngineSection)


def with_defaults(model: M, defaults: Mapping[str, Any]) -> M:
    """A copy of `model` with `defaults` for every field not set explicitly.

    A mapping value is applied to the nested section of that name, field by field.
    """
    update: dict[str, Any] = {}
    for name, value in defaults.items():
        current = getattr(model, name)
        if isinstance(value, Mapping) and isinstance(current, BaseModel):
            nested = with_defaults(current, value)
            if nested is not current:
                update[name] = nested
        elif name not in model.model_fields_set:
            update[name] = value
    return model.model_copy(update=update) if update else model


def apply_profile(
    section: S,
    profile: Profile,
    gpu_engine: str,
    gpu_field: str,
    gpu: int,
    gpu_defaults: Mapping[str, Any] | None = None,
) -> S:
    """`section` with the defaults `profile` gives it; fields set explicitly win.

    `fake`: the fake engine. `dual-gpu`: `gpu_engine`, and unless another engine was
    chosen, its settings (the field `gpu_field`) on CUDA, on physical GPU `gpu` unless
    they already name a `device_index`, with `gpu_defaults` (the production model).
    """
    if profile == "fake":
        return with_defaults(section, {"engine": "fake"})
    if profile != "dual-gpu":
        return section
    section = with_defaults(section, {"engine": gpu_engine})
    if section.engine != gpu_engine:
        return section
    defaults: dict[str, Any] = {"device": "cuda", **(gpu_defaults or {})}
    if "device_index" not in getattr(section, gpu_field).model_fields_set:
        defaults["gpu"] = gpu
    return with_defaults(section, {gpu_field: defaults})
