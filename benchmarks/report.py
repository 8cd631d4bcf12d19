"""What every engine benchmark records beside its numbers (lives in services.common.report)."""

from __future__ import annotations

from services.common.report import (
    command,
    cpu_model,
    gpus,
    machine,
    percentile,
    stamped,
    summary,
    versions,
    write,
)

__all__ = [
    "command",
    "cpu_model",
    "gpus",
    "machine",
    "percentile",
    "stamped",
    "summary",
    "versions",
    "write",
]
