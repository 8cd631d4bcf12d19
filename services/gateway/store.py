"""Sessions in Redis: settings and history, kept for a resume window after the client leaves.

Any gateway process can restore a session (`/v1/stream?session_id=ID`), so a client
whose gateway restarted reconnects through the load balancer to whichever is up.

One writer at a time: a record names the gateway process whose session writes it
(`owner`), a resume claims it, and a save by any other process is refused. A client whose
network changed may reconnect through another gateway while the first still holds its
old socket: that one's later saves (its final one when the dead socket is found) would
otherwise put back the history as it was before the new connection's turns.

Beside the record, `<key>:unheard` says where the session's last utterance sent for
transcription lies (its ASR job's entry), written as the job goes: a gateway killed before
it took that utterance's words leaves it, and the next connection hears it again. The
record names the utterances whose words were taken (`taken`), so one already in the
history is not heard twice.

A record expires `ttl_s` after its session closed, not after its last save: while the
session is open, its gateway process pushes the expiry back (`keep_alive`, one task per
process, every third of the TTL). A process killed outright stops doing so, and its
sessions' records expire a TTL later, as after a close.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import uuid
from collections.abc import Collection
from typing import Final, NamedTuple

from pydantic import BaseModel, ValidationError
from redis.asyncio import Redis

from services.common.bus.connection import REDIS_FAILED
from services.common.bus.durable import durable_write
from services.common.bus.keys import Keys
from services.common.bus.settings import RedisSettings
from services.common.errors import Forbidden
from services.common.protocol.events import SessionConfig
from services.gateway.agent import Turn

log = logging.getLogger(__name__)

_OWNER: Final = r'^{"owner":"[^"]*"'
"""The owner at the head of a stored record, as a Lua pattern (ids hold no quote)."""

SAVE: Final = f"""
local raw = redis.call('GET', KEYS[1])
if raw then
  local head = string.match(raw, '{_OWNER}')
  if head and head ~= '{{"owner":""' and head ~= '{{"owner":"' .. ARGV[2] .. '"' then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3])
return 1
"""
"""Write the record unless another process owns it: 1 when written."""

CLAIM: Final = f"""
local raw = redis.call('GET', KEYS[1])
if not raw then return false end
local head = string.match(raw, '{_OWNER}')
local rest = head and string.sub(raw, #head + 1) or (',' .. string.sub(raw, 2))
local claimed = '{{"owner":"' .. ARGV[1] .. '"' .. rest
redis.call('SET', KEYS[1], claimed, 'KEEPTTL')
return claimed
"""
"""Make this process the record's owner; the record as it now is (nil: none)."""


REFRESH: Final = """
local head = '{"owner":"' .. ARGV[1] .. '"'
if redis.call('GETRANGE', KEYS[1], 0, #head - 1) ~= head then return 0 end
return redis.call('EXPIRE', KEYS[1], ARGV[2])
"""
"""Push back the record's expiry if this process (ARGV[1]) owns it, reading only the
record's head (written as SAVE and CLAIM match it): 1 when done. A record gone stays gone;
one claimed elsewhere is left alone."""


class StoredSession(BaseModel):
    """What a resumed session gets back."""

    owner: str = ""
    """The gateway process that writes it (first: the scripts below read it in place)."""
    config: SessionConfig
    history: list[Turn]
    tenant: str
    """Whose session it is: only a credential of this tenant resumes it (a record without
    one is unreadable, never anyone's)."""
    owed: str | None = None
    """The last user turn is still to be answered: the id of its utterance ("" for typed
    text). Set when the turn is taken, cleared when a reply to it ends; a gateway killed
    while answering leaves it set, and the session's next connection answers it."""
    taken: tuple[str, ...] = ()
    """The last utterances (`TAKEN_KEPT`) whose words joined the history, oldest first."""


TAKEN_KEPT: Final = 16


class Unheard(BaseModel):
    """A session's last utterance sent for transcription: where its audio lies."""

    utterance_id: str
    stream: str
    """The ASR job stream that holds it."""
    entry_id: str
    """Its job's entry there."""
    start_ms: int
    end_ms: int


class Resumable(NamedTuple):
    """A stored session as a resume gets it back."""

    config: SessionConfig
    history: list[Turn]
    owed: str | None = None
    """`StoredSession.owed`."""
    taken: tuple[str, ...] = ()
    """`StoredSession.taken`."""


class SessionStore:
    """Saves and loads sessions under `<prefix>:session:<id>` with a TTL."""

    def __init__(
        self,
        redis: Redis,
        prefix: str,
        ttl_s: int,
        settings: RedisSettings | None = None,
        owner: str | None = None,
    ) -> None:
        self.redis = redis
        self.owner = owner or f"store-{uuid.uuid4().hex}"
        """This process (a gateway's id and a random part: ids may be configured twice)."""
        self.ttl_s = ttl_s
        self.keys = Keys(prefix)
        self.settings = settings or RedisSettings(prefix=prefix)

    def key(self, session_id: str) -> str:
        return self.keys.session(session_id)

    async def save(
        self,
        config: SessionConfig,
        history: list[Turn],
        tenant: str,
        owed: str | None = None,
        taken: tuple[str, ...] = (),
    ) -> bool:
        """Write the session; False when another gateway process has claimed it (its
        client resumed it there). A Redis outage only loses resumability: logged, True."""
        stored = StoredSession(
            owner=self.owner,
            config=config.model_copy(update={"resumed": None}),
            history=history,
            tenant=tenant,
            owed=owed,
            taken=taken[-TAKEN_KEPT:],
        )
        key = self.key(config.id)
        script = ("EVAL", SAVE, 1, key, stored.model_dump_json(), self.owner, self.ttl_s)
        try:
            (written,) = await durable_write(self.redis, self.settings, key, [script])
        except REDIS_FAILED as exc:  # out of reach, or refusing (OOM, say)
            log.warning("could not save session %s: %s", config.id, exc)
            return True
        if not written:
            log.info("session %s is resumed on another gateway: not saved here", config.id)
        return bool(written)

    async def load(self, session_id: str, tenant: str) -> Resumable | None:
        """The stored session, or None when unknown, expired or out of reach (Redis down);
        Forbidden when it is another tenant's (its id leaked or was guessed)."""
        try:
            raw = await self.redis.get(self.key(session_id))
        except REDIS_FAILED as exc:
            log.warning("could not load session %s: starting afresh (%s)", session_id, exc)
            return None
        return self._read(session_id, raw, tenant)

    async def claim(self, session_id: str, tenant: str, loaded: Resumable) -> Resumable | None:
        """Resume the session here: this process becomes its only writer, and gets it as
        it is now (a save of its old gateway's may have come since `load`); `loaded` when
        Redis is out of reach. None when it is gone; Forbidden as `load`. Call it after
        `load` checked the tenant: a claim by another tenant's credential would block the
        owner's saves."""
        key = self.key(session_id)
        try:
            (raw,) = await durable_write(
                self.redis, self.settings, key, [("EVAL", CLAIM, 1, key, self.owner)]
            )
        except REDIS_FAILED as exc:
            log.warning("could not claim session %s: %s", session_id, exc)
            return loaded
        return self._read(session_id, raw, tenant)

    async def note_unheard(self, session_id: str, unheard: Unheard | None) -> None:
        """Where the session's last utterance sent for transcription lies (None: it went
        on, nothing to hear again); kept `ttl_s`. Redis out of reach: logged."""
        key = self.keys.unheard(session_id)
        try:
            if unheard is None:
                await self.redis.delete(key)
            else:
                await self.redis.set(key, unheard.model_dump_json(), ex=self.ttl_s)
        except REDIS_FAILED as exc:
            log.warning("could not note session %s's utterance: %s", session_id, exc)

    async def unheard(self, session_id: str) -> Unheard | None:
        """The session's last utterance sent for transcription, if noted (None as well when
        Redis is out of reach, or the note is unreadable)."""
        try:
            raw = await self.redis.get(self.keys.unheard(session_id))
        except REDIS_FAILED as exc:
            log.warning("could not read session %s's utterance: %s", session_id, exc)
            return None
        if raw is None:
            return None
        try:
            return Unheard.model_validate_json(raw)
        except ValidationError:
            log.error("session %s's utterance note is unreadable: not heard again", session_id)
            return None

    async def refresh(self, session_ids: Collection[str]) -> int:
        """Make the records of these sessions (open here) expire `ttl_s` from now, in one
        round trip; those that another process has claimed, or that are gone, are left as
        they are. How many were refreshed (0 when Redis is out of reach: logged)."""
        if not session_ids:
            return 0
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for session_id in session_ids:
                    pipe.execute_command(
                        "EVAL", REFRESH, 1, self.key(session_id), self.owner, self.ttl_s
                    )
                replies = await pipe.execute()
        except REDIS_FAILED as exc:
            log.warning("could not refresh %d session(s): %s", len(session_ids), exc)
            return 0
        return sum(1 for reply in replies if reply == 1)

    async def keep_alive(self, live: Collection[str], every_s: float | None = None) -> None:
        """Until cancelled, `refresh` the sessions `live` holds (the ids of those open in this
        process, read at each round) every `every_s` (default: a third of the TTL)."""
        every_s = self.ttl_s / 3 if every_s is None else every_s
        while True:
            await asyncio.sleep(every_s)
            await self.refresh(list(live))

    @staticmethod
    def _read(session_id: str, raw: bytes | str | None, tenant: str) -> Resumable | None:
        if raw is None:
            return None
        try:
            stored = StoredSession.model_validate_json(raw)
        except ValidationError:
            log.error("stored session %s is unreadable: starting afresh", session_id)
            return None
        if not hmac.compare_digest(stored.tenant.encode(), tenant.encode()):
            raise Forbidden("this session belongs to another tenant")
        return Resumable(stored.config, stored.history, stored.owed, stored.taken)
