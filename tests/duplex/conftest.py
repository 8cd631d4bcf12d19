"""The duplex tests need torch and moshi: `make duplex-test` runs them from .venv-duplex.

In an environment without them (.venv) this folder collects nothing; `make test` runs it
in .venv-duplex, where a missing package fails the run instead (no test collected).
"""

from __future__ import annotations

import importlib.util

HAVE_DUPLEX = all(importlib.util.find_spec(m) for m in ("torch", "moshi", "sphn"))
collect_ignore_glob = [] if HAVE_DUPLEX else ["test_*.py"]


def pytest_configure() -> None:
    """One intra-op thread: with torch's AVX2 kernels and two threads (a 2-core CI without
    AVX-512) the tiny model's codes differ from run to run on the same input, and these
    tests compare codes exactly. `make duplex-test` also sets OMP_NUM_THREADS=1 for any
    process a test starts."""
    if HAVE_DUPLEX:
        import torch

        torch.set_num_threads(1)
