"""numpy's BLAS thread pool, held to what a service needs.

numpy's matrix products run on OpenBLAS, which starts one thread per core (unless the
environment says otherwise) and, after a product, leaves its threads spinning for the next.
In these services numpy's products are small (the log-Mel filterbanks of Whisper and Smart
Turn, say) and the heavy work runs in the engines' own pools (onnxruntime, CTranslate2), so
the spinning threads burn a core while the engine works beside them. On a 2-core machine a
Smart Turn ask cost 92 ms of CPU with numpy's two BLAS threads and 51 ms with one, and a
spoken turn 1.03 CPU-seconds against 0.90 (`benchmarks/cpu_per_turn.py`).
"""

from __future__ import annotations

import logging

from threadpoolctl import threadpool_info, threadpool_limits

log = logging.getLogger(__name__)


def limit_blas_threads(threads: int) -> dict[str, int]:
    """Hold every BLAS library loaded in this process to `threads` (0: leave them as they
    are); each library's thread count after, by name (`openblas`, `mkl`)."""
    if threads > 0:
        threadpool_limits(limits=threads, user_api="blas")
    counts = {
        str(info["internal_api"]): int(info["num_threads"])
        for info in threadpool_info()
        if info["user_api"] == "blas"
    }
    log.debug("BLAS threads: %s", counts)
    return counts
