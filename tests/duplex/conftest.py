"""The duplex tests need torch and moshi: `make duplex-test` runs them from .venv-duplex.

In an environment without them (.venv) this folder collects nothing; `make test` runs it
in .venv-duplex, where a missing package fails the run instead (no test collected).
"""

from __future__ import annotations

import importlib.util

HAVE_DUPLEX = all(importlib.util.find_spec(m) for m in ("torch", "moshi", "sphn"))
collect_ignore_glob = [] if HAVE_DUPLEX else ["test_*.py"]


def pytest_configure() -> None:
    """Below AVX-512, torch's deterministic kernels: with its AVX2 kernels and two threads
    (a 2-core CI without AVX-512) the tiny model's codes differ from run to run on the same
    input, and these tests compare codes exactly (3 failures a run). Not with AVX-512:
    there torch 2.13 corrupts the heap in the model's step with deterministic kernels or
    one intra-op thread ("corrupted size vs. prev_size"), and its default kernels are
    repeatable."""
    if HAVE_DUPLEX:
        import torch

        if torch.backends.cpu.get_cpu_capability() != "AVX512":
            torch.use_deterministic_algorithms(True)
