"""The duplex tests need torch and moshi: `make duplex-test` runs them from .venv-duplex.

In an environment without them (.venv) this folder collects nothing; `make test` runs it
in .venv-duplex, where a missing package fails the run instead (no test collected).
"""

from __future__ import annotations

import importlib.util

collect_ignore_glob = (
    [] if all(importlib.util.find_spec(m) for m in ("torch", "moshi", "sphn")) else ["test_*.py"]
)
