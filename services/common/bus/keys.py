"""Every Redis key name the deployment uses, built in one place (`Keys`).

Hash tags (`{...}`) keep what one command touches on one Cluster slot: each job-stream
shard has its own tag, spread evenly over the 16384 slots.
"""

from __future__ import annotations

import zlib

from redis.crc import key_slot

from services.common.tenancy import DEFAULT_TENANT

SLOTS = 16384


def _shard_tag(base: str, shard: int, shards: int) -> str:
    """A hash tag for shard `shard` of `shards` whose slot lies in the shard's share of
    the 16384 slots, so that N shards spread evenly over masters holding equal ranges."""
    low, high = shard * SLOTS // shards, (shard + 1) * SLOTS // shards
    for salt in range(100_000):
        tag = f"{base}.{shard}.{salt}"
        if low <= key_slot(tag.encode()) < high:
            return tag
    return f"{base}.{shard}"  # unreachable for shards <= 16384


def dead_letter(stream: str) -> str:
    """The dead-letter stream of a job stream (it shares the stream's hash tag)."""
    return f"{stream}:dead"


class Keys:
    """Every key name the deployment uses, under one prefix.

    Hash tags (`{...}`): each job-stream shard has its own tag, and the dead-letter
    stream of a shard shares it; a gateway's result stream is tagged by the gateway id;
    a session by its id. With `shards=1` the names are the historical ones (no tags).
    Keys of different tags are never used in one multi-key command or transaction.
    """

    def __init__(self, prefix: str, shards: int = 1) -> None:
        self.prefix = prefix
        self.shards = shards
        self._tags: dict[tuple[str, int], str] = {}

    def jobs(self, service: str, lane: str = "final", shard: int = 0) -> str:
        """The job stream of a service (`asr`, `tts`) and lane; with shards, of one shard."""
        base = f"{self.prefix}:{service}:jobs" + ("" if lane == "final" else f":{lane}")
        if self.shards <= 1:
            return base
        name = f"{service}.{lane}"
        tag = self._tags.get((name, shard))
        if tag is None:
            tag = self._tags[(name, shard)] = _shard_tag(name, shard, self.shards)
        return f"{base}:{{{tag}}}"

    def job_shards(self, service: str, lane: str = "final") -> list[str]:
        """Every shard of a job stream."""
        return [self.jobs(service, lane, shard) for shard in range(max(1, self.shards))]

    def shard_of(self, routing_key: str) -> int:
        """The shard a session's jobs go to (stable across processes)."""
        return zlib.crc32(routing_key.encode()) % max(1, self.shards)

    def results(self, gateway_id: str) -> str:
        """The result stream owned by one gateway process."""
        if self.shards <= 1:
            return f"{self.prefix}:gw:{gateway_id}:results"
        return f"{self.prefix}:gw:{{{gateway_id}}}:results"

    def done(self, job_id: str) -> str:
        """Idempotency mark: the job's results were published."""
        return f"{self.prefix}:done:{job_id}"

    def cancelled(self, response_id: str) -> str:
        """Cancellation mark of a response."""
        return f"{self.prefix}:cancel:{response_id}"

    def session(self, session_id: str) -> str:
        """A stored session (gateway resume)."""
        return f"{self.prefix}:session:{session_id}"

    def unheard(self, session_id: str) -> str:
        """Where a session's last utterance sent for transcription lies, until its words are
        taken (a resume hears it again)."""
        return f"{self.prefix}:session:{session_id}:unheard"

    def api_key(self, key_id: str) -> str:
        """One API key's record (tenant, name, secret hash, limits, revocation)."""
        return f"{self.prefix}:auth:key:{key_id}"

    def api_key_index(self) -> str:
        """The set of every API key id."""
        return f"{self.prefix}:auth:keys"

    def signing_secret(self) -> str:
        """The client-token signing secret made once when none is configured."""
        return f"{self.prefix}:auth:signing_secret"

    def rate(self, tenant: str, kind: str) -> str:
        """A tenant's fixed-window counter of one kind of event."""
        return f"{self.prefix}:auth:rate:{tenant}:{kind}"

    def live_sessions(self, tenant: str) -> str:
        """A tenant's concurrent-session leases (a sorted set)."""
        return f"{self.prefix}:auth:live:{tenant}"

    def audio_used(self, tenant: str, day: str) -> str:
        """A tenant's milliseconds of audio heard on one UTC day (`yyyymmdd`)."""
        return f"{self.prefix}:auth:audio:{tenant}:{day}"

    def voice(self, voice_id: str, part: str = "") -> str:
        """A library voice's metadata (`part` "": the hash; ":clip": its audio)."""
        return f"{self.prefix}:voice:{voice_id}{part}"

    def voices(self, tenant: str) -> str:
        """A tenant's set of voice ids (the default tenant's is the one from before tenants,
        so a library made then stays the default tenant's)."""
        if tenant == DEFAULT_TENANT:
            return f"{self.prefix}:voices"
        return f"{self.prefix}:t:{tenant}:voices"
