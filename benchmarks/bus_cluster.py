"""Bus throughput at saturation: one Redis against a three-master Cluster, in one run.

    python -m benchmarks.bus_cluster --seconds 8 --procs 2 --out benchmarks/results/bus_cluster.json

Each client process submits jobs (`JobStream.submit`) from `--producers` coroutines and
serves them from `--consumers` coroutines (split over the shards) doing what `JobWorker`
does for a job without its handler (XREADGROUP, is-done check, done mark, XACK), so a
job costs the bus what a real job costs it. Jobs/s is counted over the measured window
after a warm-up. The Redis servers' own CPU (INFO cpu) is recorded too: when one Redis is
far from a full core, the clients, not Redis, are the limit, and a Cluster cannot go
faster on the same cores (docs/redis-ha.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from services.common.bus.connection import connect
from services.common.bus.keys import Keys
from services.common.bus.settings import RedisSettings
from services.common.bus.streams import JobStream
from services.common.bus.worker import job_id_of
from services.loadtest.report import versions, write
from services.ops.redis_server import free_port, start_redis
from tests.redis_ha import ClusterSet


async def _client(
    settings: RedisSettings, seconds: float, warmup: float, producers: int, consumers: int = 8
) -> int:
    bus = connect(settings)
    keys = Keys(settings.prefix, settings.shards)
    streams = keys.job_shards("asr")
    handled = 0
    window = (time.monotonic() + warmup, time.monotonic() + warmup + seconds)

    streams_in = [JobStream(bus, settings, s, "asr", f"c-{os.getpid()}") for s in streams]
    for stream in streams_in:
        await stream.ensure_group()
    submit = [JobStream(bus, settings, s, "asr", "producer") for s in streams]

    async def consume(stream: JobStream) -> None:
        """What JobWorker does for a job, minus the handler: done check, done mark, XACK."""
        nonlocal handled
        while time.monotonic() < window[1]:
            for delivery in await stream.read(64, block_ms=100):
                job_id = job_id_of(delivery) or ""
                if not await stream.is_done(job_id, keys):
                    await stream.mark_done(job_id, keys)
                await stream.ack(delivery.entry_id)
                if window[0] <= time.monotonic() < window[1]:
                    handled += 1

    async def produce(index: int) -> None:
        n = 0
        while time.monotonic() < window[1]:
            n += 1
            job_id = f"j-{os.getpid()}-{index}-{n}"
            meta = json.dumps({"job_id": job_id}).encode()
            await submit[n % len(submit)].submit({b"meta": meta, b"audio": b"\0" * 640})

    await asyncio.gather(
        *(produce(i) for i in range(producers)),
        *(
            consume(stream)
            for stream in streams_in
            for _ in range(max(1, consumers // len(streams_in)))
        ),
    )
    await bus.aclose()
    return handled


def _process(args: tuple[RedisSettings, float, float, int, int]) -> int:
    return asyncio.run(_client(*args))


def _cpu(ports: list[int]) -> float:
    total = 0.0
    for port in ports:
        info: Any = redis.Redis(port=port).info("cpu")
        total += float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
    return total


def measure(
    name: str, settings: RedisSettings, masters: list[int], args: argparse.Namespace
) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    cpu_before = _cpu(masters)
    started = time.monotonic()
    with ctx.Pool(args.procs) as pool:
        counts = pool.map(
            _process,
            [(settings, args.seconds, args.warmup, args.producers, args.consumers)] * args.procs,
        )
    wall = time.monotonic() - started
    cpu = _cpu(masters) - cpu_before
    jobs_per_s = sum(counts) / args.seconds
    result = {
        "name": name,
        "jobs_per_s": round(jobs_per_s),
        "shards": settings.shards,
        "redis_cpu_s_per_s": round(cpu / wall, 2),
        "redis_cpu_per_master_s_per_s": round(cpu / wall / len(masters), 2),
    }
    print(result)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--procs", type=int, default=2, help="client processes")
    parser.add_argument("--producers", type=int, default=32, help="submitters a process")
    parser.add_argument("--consumers", type=int, default=12, help="readers a process")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as workdir:
        port = free_port()
        proc = start_redis(port, Path(workdir) / "single")
        try:
            single = RedisSettings(url=f"redis://127.0.0.1:{port}/0", prefix="b1")
            results.append(measure("single Redis", single, [port], args))
        finally:
            proc.kill()
            proc.wait()
        with ClusterSet(Path(workdir) / "cluster") as cluster:
            masters = [
                p
                for p in cluster.alive()
                if redis.Redis(port=p).info("replication")["role"] == "master"
            ]
            url = cluster.url
            sharded = RedisSettings(url=url, prefix=f"b{uuid.uuid4().hex[:4]}", shards=3)
            results.append(measure("3-master cluster, 3 shards", sharded, masters, args))
    speedup = results[1]["jobs_per_s"] / max(1, results[0]["jobs_per_s"])
    body = {
        "benchmark": "bus_cluster",
        "versions": versions("redis"),
        "cores": os.cpu_count(),
        "settings": vars(args) | {"out": str(args.out)},
        "results": results,
        "cluster_over_single": round(speedup, 2),
    }
    print(f"cluster / single: {speedup:.2f}x")
    if args.out:
        write(args.out, body)


if __name__ == "__main__":
    main()
