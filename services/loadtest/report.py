"""What every measurement records beside its numbers: command, machine, versions, time.

Shared by the benchmarks and `voice-agent loadtest` (the percentiles are `services.common.stats`).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def gpus() -> list[str]:
    """`name, memory, driver` of every GPU nvidia-smi lists (empty without a driver)."""
    if shutil.which("nvidia-smi") is None:
        return []
    query = "--query-gpu=name,memory.total,driver_version"
    try:
        out = subprocess.run(
            ["nvidia-smi", query, "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def machine() -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "gpus": gpus(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
    }


def versions(*packages: str) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for package in packages:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


def command() -> str:
    """The exact command line of a `python -m` run, as it could be typed again."""
    return shlex.join(["python", "-m", _module(), *sys.argv[1:]])


def _module() -> str:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return spec.name if spec is not None else Path(sys.argv[0]).stem


def stamped(body: dict[str, Any], command_line: str | None = None) -> dict[str, Any]:
    """`body` after the command (this process's own when not given), machine and UTC time."""
    return {
        "command": command_line if command_line is not None else command(),
        "machine": machine(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **body,
    }


def unwritable(path: Path, kind: str = "file") -> str | None:
    """Why `path` cannot be written as a `kind` ("file" or "folder") made with its missing
    parent folders; None when it looks writable. Checked before a long run, so that the
    run's results are not lost to a typo at its end."""
    if kind == "file" and path.is_dir():
        return "is a folder, not a file"
    if kind == "folder" and path.exists() and not path.is_dir():
        return "is a file, not a folder"
    if kind == "file" and path.exists():
        return None if os.access(path, os.W_OK) else "is not writable"
    existing = path if kind == "folder" else path.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None


def write(path: Path, body: dict[str, Any], command_line: str | None = None) -> None:
    """Write `body`, stamped, as indented JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(stamped(body, command_line), indent=2) + "\n"
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path}")
