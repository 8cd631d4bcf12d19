"""The Redis bus against a real Redis: reclaim, dead letters, idempotency, outages."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from services.common.bus.connection import REDIS_DOWN, NoReplicasError, connect
from services.common.bus.keys import Keys
from services.common.bus.messages import AsrJob, TtsJob
from services.common.bus.settings import RedisSettings
from services.common.bus.streams import Delivery, JobStream, publish
from services.common.bus.worker import JobWorker
from services.gateway.bus import GatewayBus
from services.ops.redis_server import free_port, start_redis
from tests.conftest import RedisProc


def job(job_id: str) -> dict[bytes, bytes]:
    return {b"meta": json.dumps({"job_id": job_id}).encode(), b"audio": b"\x00\x01"}


@pytest.fixture
async def bus(redis_server: RedisProc) -> AsyncIterator[tuple[RedisSettings, Keys]]:
    settings = redis_server.settings(claim_idle_ms=1000, max_deliveries=2)
    yield settings, Keys(settings.prefix)


async def test_dead_consumer_jobs_are_reclaimed(bus: tuple[RedisSettings, Keys]) -> None:
    settings, keys = bus
    redis = connect(settings)
    stream = keys.jobs("asr")
    dead = JobStream(redis, settings, stream, "asr", "dead-worker")
    # the same consumer, with an idle time no run can reach, then one any run has passed:
    # whether the job is "idle long enough" never depends on how fast this machine is
    patient = settings.model_copy(update={"claim_idle_ms": 600_000})
    eager = settings.model_copy(update={"claim_idle_ms": 50})
    live = JobStream(redis, patient, stream, "asr", "live-worker")
    await dead.ensure_group()
    await dead.submit(job("j1"))
    taken = await dead.read(10, block_ms=100)
    assert [json.loads(d.fields[b"meta"])["job_id"] for d in taken] == ["j1"]
    # the dead worker never acks; before claim_idle_ms nothing can be reclaimed
    assert await live.reclaim(10) == []
    assert await live.read(10, block_ms=50) == []
    await asyncio.sleep(0.1)  # past eager's 50 ms (a sleep lasts at least this long)
    live = JobStream(redis, eager, stream, "asr", "live-worker")
    claimed = await live.reclaim(10)
    assert [d.entry_id for d in claimed] == [taken[0].entry_id]
    assert claimed[0].fields[b"audio"] == b"\x00\x01"
    await live.ack(claimed[0].entry_id)
    assert await live.pending_count() == 0
    await redis.aclose()


def owned_job(job_id: str, **meta: Any) -> dict[bytes, bytes]:
    """A job whose meta says where its owner listens (as the gateway's jobs do)."""
    owner = {"job_id": job_id, "session_id": "s1", "reply_to": "owner:results"}
    return {b"meta": json.dumps({**owner, **meta}).encode()}


async def _failures(redis: Redis) -> list[dict[str, Any]]:
    return [json.loads(f[b"meta"]) for _, f in await redis.xrange("owner:results")]


async def test_poison_job_goes_to_dead_letter_stream(bus: tuple[RedisSettings, Keys]) -> None:
    """A job its workers died on `max_deliveries` times is set aside, and its owner told."""
    settings, keys = bus
    redis = connect(settings)
    stream = JobStream(redis, settings, keys.jobs("tts"), "tts", "w")
    await stream.ensure_group()
    await stream.submit(owned_job("poison", response_id="r1", seq=2))
    await stream.read(1, block_ms=100)  # delivery 1
    for _ in range(2):  # deliveries 2 and 3 by reclaim; max_deliveries=2
        await asyncio.sleep(1.05)
        reclaimed = await stream.reclaim(10)
        stream._claim_cursor = b"0-0"
    assert reclaimed == []
    dead = await redis.xrange(stream.dead_stream)
    assert len(dead) == 1 and json.loads(dead[0][1][b"meta"])["job_id"] == "poison"
    assert await stream.pending_count() == 0
    (failed,) = await _failures(redis)
    assert failed["kind"] == "job.failed" and failed["code"] == "internal", failed
    assert (failed["job_id"], failed["response_id"], failed["seq"]) == ("poison", "r1", 2)
    await redis.aclose()


async def test_a_job_its_handler_cannot_run_is_answered_failed_not_retried(
    bus: tuple[RedisSettings, Keys],
) -> None:
    """An error a retry would meet again (a job that does not validate, an engine's error on
    its input) is answered `job.failed` at once and acknowledged; Redis out of reach is not
    such an error (test_worker_survives_a_redis_restart)."""
    settings, keys = bus
    redis = connect(settings)
    stream = keys.jobs("asr")
    runs: list[str] = []

    async def handle(delivery: Delivery) -> None:
        meta = json.loads(delivery.fields[b"meta"])
        runs.append(meta["job_id"])
        if meta["job_id"] == "malformed":
            AsrJob.model_validate_json(delivery.fields[b"meta"])
        raise ValueError("embedded null character")

    worker = JobWorker(JobStream(redis, settings, stream, "asr", "w"), keys, handle, 4)
    producer = JobStream(redis, settings, stream, "asr", "producer")
    task = asyncio.create_task(worker.run())
    try:
        await producer.submit(owned_job("malformed", utterance_id="u1", sample_rate=7))
        await producer.submit(owned_job("engine-error", utterance_id="u2"))
        async with asyncio.timeout(10):
            while len(await _failures(redis)) < 2:
                await asyncio.sleep(0.02)
        failures = {f["job_id"]: f for f in await _failures(redis)}
        assert failures["malformed"]["code"] == "invalid_message"
        assert failures["malformed"]["message"].startswith("malformed job: sample_rate: ")
        assert failures["engine-error"]["code"] == "internal"
        assert failures["engine-error"]["message"] == "internal error (ValueError)"
        assert failures["engine-error"]["utterance_id"] == "u2"
        async with asyncio.timeout(10):
            while await producer.pending_count():
                await asyncio.sleep(0.02)
        assert sorted(runs) == ["engine-error", "malformed"]  # once each: acknowledged
        assert await JobStream(redis, settings, stream, "asr", "w").is_done("malformed", keys)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await redis.aclose()


async def test_worker_crash_loses_no_job_and_repeats_nothing(
    bus: tuple[RedisSettings, Keys],
) -> None:
    """Worker A takes a job and dies mid-way; worker B finishes it; one result only."""
    settings, keys = bus
    redis = connect(settings)
    stream, replies = keys.jobs("asr"), f"{settings.prefix}:replies"
    started = asyncio.Event()

    async def hang(delivery: Delivery) -> None:
        started.set()
        await asyncio.Event().wait()  # never finishes: "crashes" when cancelled

    async def answer(delivery: Delivery) -> None:
        await publish(redis, settings, replies, {b"meta": delivery.fields[b"meta"]})

    worker_a = JobWorker(JobStream(redis, settings, stream, "asr", "a"), keys, hang, 4)
    worker_b = JobWorker(JobStream(redis, settings, stream, "asr", "b"), keys, answer, 4)
    task_a = asyncio.create_task(worker_a.run())
    await JobStream(redis, settings, stream, "asr", "producer").submit(job("once"))
    await asyncio.wait_for(started.wait(), 5)
    task_a.cancel()  # the crash: the job stays pending, unacknowledged
    task_b = asyncio.create_task(worker_b.run())
    try:
        async with asyncio.timeout(10):
            while not await redis.xlen(replies):
                await asyncio.sleep(0.05)
        # the same job delivered again (e.g. a second reclaim) is skipped as done: wait
        # until B has taken it and acknowledged it (no fixed sleep: a busy machine is slow)
        again = await JobStream(redis, settings, stream, "asr", "producer").submit(job("once"))
        async with asyncio.timeout(30):
            while not await _handled(redis, stream, again):
                await asyncio.sleep(0.05)
        assert await redis.xlen(replies) == 1
    finally:
        task_b.cancel()
        await asyncio.gather(task_a, task_b, return_exceptions=True)
        await redis.aclose()


async def _handled(redis: Redis, stream: str, entry_id: bytes) -> bool:
    """Whether the group has delivered `entry_id` and nothing it delivered is pending."""
    (group,) = await redis.xinfo_groups(stream)
    last = group["last-delivered-id"]
    delivered = _entry(last) >= _entry(entry_id)
    return delivered and int(group["pending"]) == 0


def _entry(entry_id: bytes | str) -> tuple[int, int]:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    millis, _, seq = text.partition("-")
    return int(millis), int(seq)


async def test_worker_survives_a_redis_restart(tmp_path: Path) -> None:
    port = free_port()
    proc = start_redis(port, tmp_path)
    settings = RedisSettings(url=f"redis://127.0.0.1:{port}/0", prefix="restart", block_ms=200)
    keys = Keys(settings.prefix)
    redis = connect(settings)
    seen: list[str] = []

    async def record(delivery: Delivery) -> None:
        seen.append(json.loads(delivery.fields[b"meta"])["job_id"])

    worker = JobWorker(JobStream(redis, settings, keys.jobs("asr"), "asr", "w"), keys, record, 2)
    task = asyncio.create_task(worker.run())
    producer = JobStream(connect(settings), settings, keys.jobs("asr"), "asr", "p")
    try:
        await producer.submit(job("before"))
        async with asyncio.timeout(5):
            while seen != ["before"]:
                await asyncio.sleep(0.05)
        proc.terminate()
        proc.wait(10)
        async with asyncio.timeout(10):
            while worker.connected:
                await asyncio.sleep(0.05)
        proc = start_redis(port, tmp_path)  # a fresh, empty Redis (no persistence)
        await producer.submit(job("after"))
        async with asyncio.timeout(15):
            while "after" not in seen:
                await asyncio.sleep(0.05)
        assert worker.connected
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        proc.terminate()
        proc.wait(10)
        await redis.aclose()
        await producer.redis.aclose()


class _Refusing(JobStream):
    """A job stream whose Redis refuses the first reads (still loading, or NOAUTH)."""

    refusals: list[str]

    async def read(self, count: int, block_ms: int | None = None) -> list[Delivery]:
        if self.refusals:
            raise ResponseError(self.refusals.pop(0))
        return await super().read(count, block_ms)


async def test_a_refusing_redis_never_stops_the_worker(bus: tuple[RedisSettings, Keys]) -> None:
    """Any refusal from Redis is retried: the consumer must not die while /ready says 200."""
    settings, keys = bus
    redis = connect(settings)
    stream, replies = keys.jobs("asr"), f"{settings.prefix}:refused-replies"

    async def answer(delivery: Delivery) -> None:
        await publish(redis, settings, replies, {b"meta": delivery.fields[b"meta"]})

    refusing = _Refusing(redis, settings, stream, "asr", "a")
    refusing.refusals = [
        "LOADING Redis is loading the dataset in memory",
        "NOAUTH Authentication required.",
    ]
    worker = JobWorker(refusing, keys, answer, 4)
    task = asyncio.create_task(worker.run())
    try:
        await JobStream(redis, settings, stream, "asr", "producer").submit(job("later"))
        async with asyncio.timeout(30):
            while not await redis.xlen(replies):
                await asyncio.sleep(0.05)
        assert refusing.refusals == [] and not task.done()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await redis.aclose()


async def test_a_live_workers_long_job_is_never_reclaimed(
    bus: tuple[RedisSettings, Keys],
) -> None:
    """A job running twice `claim_idle_ms` stays its worker's (it touches it), while a second
    worker keeps reclaiming: one run, one result. (3 s idle: the touches, every 0.75 s, keep
    a 2.25 s margin against a busy machine's stalls.)"""
    settings, keys = bus
    settings = settings.model_copy(update={"claim_idle_ms": 3000})
    redis = connect(settings)
    stream, replies = keys.jobs("asr"), f"{settings.prefix}:long-replies"
    runs: list[str] = []

    async def slow(delivery: Delivery) -> None:
        runs.append(delivery.fields[b"meta"].decode())
        await asyncio.sleep(6.0)
        await publish(redis, settings, replies, {b"meta": delivery.fields[b"meta"]})

    workers = [
        JobWorker(JobStream(redis, settings, stream, "asr", name), keys, slow, 4)
        for name in ("a", "b")
    ]
    tasks = [asyncio.create_task(w.run()) for w in workers]
    try:
        await JobStream(redis, settings, stream, "asr", "producer").submit(job("long"))
        async with asyncio.timeout(30):
            while not await redis.xlen(replies):
                await asyncio.sleep(0.05)
        assert len(runs) == 1  # never reclaimed by the other worker while it ran
        assert await redis.xlen(replies) == 1
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await redis.aclose()


class _LosingTouches(JobStream):
    """A job stream whose touches are lost while `losing` is set: acknowledged by a master
    that died before its replica had them (a failover), so the worker's jobs in flight go
    idle although the worker lives. Counts the reclaims that found `watched` idle past
    `claim_idle_ms` (nothing touches it in between, so XAUTOCLAIM brings it back)."""

    losing = True
    watched: bytes | None = None
    due_reclaims = 0

    async def touch(self, entry_ids: list[bytes]) -> None:
        if not self.losing:
            await super().touch(entry_ids)

    async def reclaim(self, *args: Any, **kwargs: Any) -> list[Delivery]:
        due = False
        if self.watched is not None:
            row = await _pending(self.redis, self.stream, self.group, self.watched)
            due = row["time_since_delivered"] >= self.settings.claim_idle_ms
        claimed = await super().reclaim(*args, **kwargs)
        self.due_reclaims += due
        return claimed


async def test_a_job_in_flight_is_not_reclaimed_by_its_own_worker(
    bus: tuple[RedisSettings, Keys],
) -> None:
    """After a failover lost a live worker's touches, its job in flight goes idle; the
    worker's own XAUTOCLAIM takes it back. It must neither run it a second time nor spend
    one of its `max_deliveries` on it: a failover is no failure of the job (a drill once
    dead-lettered a healthy turn's job that way)."""
    settings, keys = bus
    redis = connect(settings)
    stream, replies = keys.jobs("asr"), f"{settings.prefix}:own-replies"
    runs: list[bytes] = []
    release = asyncio.Event()

    async def held(delivery: Delivery) -> None:
        runs.append(delivery.entry_id)
        await release.wait()
        await publish(redis, settings, replies, {b"meta": delivery.fields[b"meta"]})

    jobs = _LosingTouches(redis, settings, stream, "asr", "w")
    worker = JobWorker(jobs, keys, held, 4)
    task = asyncio.create_task(worker.run())
    try:
        entry = await JobStream(redis, settings, stream, "asr", "producer").submit(job("held"))
        async with asyncio.timeout(10):
            while not runs:
                await asyncio.sleep(0.02)
        jobs.watched = entry
        async with asyncio.timeout(15):  # two reclaims that bring the running job back
            while jobs.due_reclaims < 2:
                await asyncio.sleep(0.02)
        assert runs == [entry]  # run once, by the worker that still runs it
        assert (await _pending(redis, stream, "asr", entry))["times_delivered"] == 1
        jobs.losing = False
        release.set()
        async with asyncio.timeout(10):
            while await jobs.pending_count():
                await asyncio.sleep(0.02)
        assert await redis.xlen(replies) == 1 and not await redis.xlen(jobs.dead_stream)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await redis.aclose()


async def _pending(redis: Redis, stream: str, group: str, entry_id: bytes) -> dict[str, int]:
    """The entry's idle time and delivery count; one no longer pending (acknowledged or
    dead-lettered) reads as long idle and never delivered."""
    rows = await redis.xpending_range(stream, group, min=entry_id, max=entry_id, count=1)
    if not rows:
        return {"time_since_delivered": 1 << 30, "times_delivered": 0}
    return {key: int(rows[0][key]) for key in ("time_since_delivered", "times_delivered")}


async def test_a_master_short_of_replicas_is_redis_out_of_reach(tmp_path: Path) -> None:
    """`min-replicas-to-write` (Redis's guard against a split brain's lost writes) refuses
    writes with NOREPLICAS while too few replicas are in reach: the bus takes that as a
    failover under way (retried, then `REDIS_DOWN`), not as an error that ends a session;
    once a replica is back, the gateway's job goes in."""
    master_port, replica_port = free_port(), free_port()
    master = start_redis(master_port, tmp_path / "master")
    replica = None
    settings = RedisSettings(url=f"redis://127.0.0.1:{master_port}/0")
    redis = connect(settings)
    try:
        await redis.config_set("min-replicas-to-write", 1)
        with pytest.raises(NoReplicasError) as refused:
            await redis.set("k", "v")
        assert isinstance(refused.value, REDIS_DOWN)
        with pytest.raises(REDIS_DOWN):  # through a pipeline, as the bus writes
            await publish(redis, settings, "results", {b"meta": b"{}"}, durable=False)

        sleeps: list[float] = []

        async def sleep(seconds: float) -> None:  # the replica arrives while the bus waits
            nonlocal replica
            sleeps.append(seconds)
            if replica is None:
                replica = start_redis(replica_port, tmp_path / "replica")
                follower = Redis(port=replica_port)
                await follower.replicaof("127.0.0.1", master_port)
                await follower.aclose()
                async with asyncio.timeout(30):
                    while (await redis.info("replication")).get("min_slaves_good_slaves") != 1:
                        await asyncio.sleep(0.05)  # in sync, and counted as good

        bus = GatewayBus(redis, settings, "gw-1", retry_s=60.0, sleep=sleep)
        job = TtsJob(
            job_id="t1", session_id="s1", response_id="r1", seq=0, text="hi", voice="v",
            sample_rate=24000, reply_to="results",
        )  # fmt: skip
        await bus.submit_tts(job)
        assert len(sleeps) == 1  # refused once, in after the replica came
        (stream,) = {s.decode() for s in await redis.keys("*tts*")}
        assert await redis.xlen(stream) == 1
    finally:
        await redis.aclose()
        for proc in (master, replica):
            if proc is not None:
                proc.terminate()
                proc.wait(10)


async def test_a_draining_worker_takes_no_new_job_and_leaves_its_stragglers_pending(
    bus: tuple[RedisSettings, Keys],
) -> None:
    """Shutdown: the job that finishes within the drain is answered; one submitted after the
    drain began is not taken; the one still running when the worker is cancelled is
    cancelled, not acknowledged, and another worker answers both of the others once."""
    settings, keys = bus
    settings = settings.model_copy(update={"block_ms": 100})
    redis = connect(settings)
    stream, replies = keys.jobs("asr"), f"{settings.prefix}:drain-replies"
    started: dict[str, asyncio.Event] = {name: asyncio.Event() for name in ("quick", "stuck")}
    release, cancelled = asyncio.Event(), []

    def name_of(delivery: Delivery) -> str:
        return str(json.loads(delivery.fields[b"meta"])["job_id"])

    async def first(delivery: Delivery) -> None:
        name = name_of(delivery)
        started[name].set()
        try:
            await release.wait() if name == "quick" else await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(name)
            raise
        await publish(redis, settings, replies, {b"meta": delivery.fields[b"meta"]})

    async def second(delivery: Delivery) -> None:
        await publish(redis, settings, replies, {b"meta": delivery.fields[b"meta"]})

    producer = JobStream(redis, settings, stream, "asr", "producer")
    worker_a = JobWorker(JobStream(redis, settings, stream, "asr", "a"), keys, first, 4)
    task_a = asyncio.create_task(worker_a.run())
    task_b = None
    try:
        await producer.submit(job("quick"))
        await producer.submit(job("stuck"))
        async with asyncio.timeout(10):
            for event in started.values():
                await event.wait()
        drain = asyncio.create_task(worker_a.drain(3.0))
        async with asyncio.timeout(10):
            await worker_a.stopped_reading.wait()
        late = await producer.submit(job("late"))
        release.set()
        async with asyncio.timeout(10):  # "quick" ends within the drain (on a busy machine too)
            while not await redis.xlen(replies):
                await asyncio.sleep(0.02)
        await drain  # returns at its timeout: "stuck" still runs
        assert [json.loads(m[b"meta"])["job_id"] for _, m in await redis.xrange(replies)] == [
            "quick"
        ]
        task_a.cancel()  # the end of the shutdown
        await asyncio.gather(task_a, return_exceptions=True)
        assert cancelled == ["stuck"]
        assert not worker_a.in_flight
        pending = await redis.xpending_range(stream, "asr", "-", "+", 10)
        assert [p["consumer"] for p in pending] == [b"a"]  # "stuck" only; "late" never taken
        assert late not in [p["message_id"] for p in pending]

        worker_b = JobWorker(JobStream(redis, settings, stream, "asr", "b"), keys, second, 4)
        task_b = asyncio.create_task(worker_b.run())
        async with asyncio.timeout(20):
            while await redis.xlen(replies) < 3:
                await asyncio.sleep(0.05)
        answered = [json.loads(m[b"meta"])["job_id"] for _, m in await redis.xrange(replies)]
        assert sorted(answered) == ["late", "quick", "stuck"]
    finally:
        for task in (task_a, task_b):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (task_a, task_b) if t), return_exceptions=True)
        await redis.aclose()
