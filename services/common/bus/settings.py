"""How to reach the Redis bus and how to use its streams (`VA_REDIS__*`)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class RedisSettings(BaseModel):
    """How to reach the Redis bus and how to use its streams."""

    url: str = "redis://127.0.0.1:6379/0"
    """Redis URL: `redis://` or `rediss://` (one server), `redis+sentinel://h1:26379,h2:26379/mymaster/0`
    (Sentinel: sentinels, master name, db) or `redis+cluster://h1:7000,h2:7001/` (Cluster:
    any startup nodes); see docs/redis-ha.md."""
    prefix: str = Field(default="va", pattern=r"^[A-Za-z0-9_.-]+$")
    """Prefix of every key this deployment uses, so several deployments can share a Redis."""
    job_stream_maxlen: int = Field(default=10_000, ge=100, le=10_000_000)
    """Approximate cap on a job stream's length (old, acknowledged entries are trimmed)."""
    result_stream_maxlen: int = Field(default=2_000, ge=100, le=1_000_000)
    """Approximate cap on a gateway's result stream."""
    block_ms: int = Field(default=1_000, ge=10, le=30_000)
    """How long a blocking XREAD/XREADGROUP waits; the socket timeout is set above it."""
    claim_idle_ms: int = Field(default=5_000, ge=1_000, le=3_600_000)
    """A pending job idle this long is reclaimed from a dead worker by XAUTOCLAIM (a live
    worker touches its jobs in flight every quarter of it, however long they run): keep it
    well below the gateway's `asr_timeout_s`/`tts_timeout_s`."""
    max_deliveries: int = Field(default=3, ge=1, le=100)
    """A job delivered this many times goes to the dead-letter stream."""
    job_ttl_s: int = Field(default=600, ge=10, le=86_400)
    """How long idempotency and cancellation markers live."""
    shards: int = Field(default=1, ge=1, le=1024)
    """Job streams per service and lane; a session's jobs go to one shard (hash of its id),
    workers read every shard (or `consume_shards`). On a Cluster, about the number of masters
    (each shard has its own hash tag, spread evenly over the slots). 1: one stream, old names."""
    consume_shards: list[int] | None = None
    """The shards this worker reads (None: all)."""
    wait_replicas: int = Field(default=0, ge=0, le=16)
    """After writes whose loss would lose a user's turn (a final ASR job, a job's last result,
    the saved session), `WAIT` for this many replicas. 0: no WAIT (a single Redis)."""
    wait_timeout_ms: int = Field(default=500, ge=1, le=60_000)
    """How long a `WAIT` may block; fewer replicas than asked is logged, not an error."""
    failover_retries: int = Field(default=20, ge=1, le=1000)
    """With a Sentinel or Cluster URL: how many times a command is retried (backoff 50 ms
    doubling to 0.5 s, about 9 s in all by default) while a failover is under way."""
