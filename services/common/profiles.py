"""Deployment profiles: one setting (`VA_PROFILE`) that changes several defaults at once.

A profile only fills in what the operator left unset: a field given explicitly (by
the environment or by code) always wins. `lite` changes nothing; the others are
applied by each service's settings: `dual-gpu` (ASR: faster-whisper on physical GPU 0;
TTS: chatterbox on physical GPU 1) and `fake` (both services' instant fake engines, so
a load test measures what the gateway and Redis add).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)


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


def gpu_defaults(section: BaseModel, physical: int) -> dict[str, Any]:
    """Run on CUDA, on `physical`, unless the section already names a device or an index."""
    defaults: dict[str, Any] = {"device": "cuda"}
    if "device_index" not in section.model_fields_set:
        defaults["gpu"] = physical
    return defaults
