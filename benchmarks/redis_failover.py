"""THE DRILL, recorded: SIGKILL a Redis master under 20 fake-engine sessions, on Sentinel
(master, two replicas, three sentinels) and on Cluster (three masters, three replicas).

    python -m benchmarks.redis_failover --out benchmarks/results/redis_failover.json

Counts turns lost and duplicated, the longest stall (no turn completing), the promotion
time and the recovery (promotion to every session having completed a turn again); the
same drill runs in `make test` (tests/e2e/test_redis_failover.py). See docs/redis-ha.md.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from services.loadtest.report import versions, write
from tests.redis_drill import failover_drill


def redis_version() -> str:
    out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True)
    return out.stdout.strip()


async def run(sessions: int) -> dict[str, Any]:
    drills = []
    for kind, gateways in (("sentinel", 1), ("cluster", 1), ("cluster", 2)):
        with tempfile.TemporaryDirectory() as workdir:
            result = await failover_drill(kind, Path(workdir), sessions, gateways, gateways)  # type: ignore[arg-type]
        print(
            f"{kind} x{gateways} gateway(s): lost {result['turns_lost']}, duplicated "
            f"{result['turns_duplicated']}, stall {result['longest_stall_s']} s, recovery "
            f"{result['recovery_after_promotion_s']} s after promotion"
        )
        drills.append(result)
    return {
        "benchmark": "redis_failover",
        "redis": redis_version(),
        "versions": versions("redis"),
        "setup": {
            "sentinel": "1 master + 2 replicas + 3 sentinels, quorum 2, down-after 1000 ms",
            "cluster": "3 masters + 3 replicas, cluster-node-timeout 1000 ms, 3 job shards",
            "bus": "wait_replicas=1 (200 ms), claim_idle_ms=2000, failover_retries=20",
            "load": f"{sessions} sessions of text turns on VA_PROFILE=fake, 5 words "
            "(1.5 s of audio) each; the master is SIGKILLed after 2 turns a session",
        },
        "targets": {"duplicated": 0, "lost": 0, "recovery_after_promotion_s": 10},
        "drills": drills,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    body = asyncio.run(run(args.sessions))
    if args.out:
        write(args.out, body)


if __name__ == "__main__":
    main()
