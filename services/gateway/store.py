"""Sessions in Redis: settings and history, kept for a resume window after the client leaves.

Any gateway process can restore a session (`/v1/stream?session_id=ID`), so a client
whose gateway restarted reconnects through the load balancer to whichever is up.
"""

from __future__ import annotations

import hmac
import logging

from pydantic import BaseModel, ValidationError
from redis.asyncio import Redis
from redis.exceptions import RedisError

from services.common.bus.connection import REDIS_DOWN
from services.common.bus.durable import durable_set
from services.common.bus.keys import Keys
from services.common.bus.settings import RedisSettings
from services.common.errors import Forbidden
from services.common.protocol.events import SessionConfig
from services.gateway.agent import Turn

log = logging.getLogger(__name__)


class StoredSession(BaseModel):
    """What a resumed session gets back."""

    config: SessionConfig
    history: list[Turn]
    tenant: str
    """Whose session it is: only a credential of this tenant resumes it (a record without
    one is unreadable, never anyone's)."""


class SessionStore:
    """Saves and loads sessions under `<prefix>:session:<id>` with a TTL."""

    def __init__(
        self, redis: Redis, prefix: str, ttl_s: int, settings: RedisSettings | None = None
    ) -> None:
        self.redis = redis
        self.prefix = prefix
        self.ttl_s = ttl_s
        self.keys = Keys(prefix)
        self.settings = settings or RedisSettings(prefix=prefix)

    def key(self, session_id: str) -> str:
        return self.keys.session(session_id)

    async def save(self, config: SessionConfig, history: list[Turn], tenant: str) -> None:
        """Write the session (a Redis outage only loses resumability, so it is logged)."""
        stored = StoredSession(
            config=config.model_copy(update={"resumed": None}),
            history=history,
            tenant=tenant,
        )
        try:
            await durable_set(
                self.redis, self.settings, self.key(config.id), stored.model_dump_json(), self.ttl_s
            )
        except (*REDIS_DOWN, RedisError) as exc:  # out of reach, or refusing (OOM, say)
            log.warning("could not save session %s: %s", config.id, exc)

    async def load(self, session_id: str, tenant: str) -> tuple[SessionConfig, list[Turn]] | None:
        """The stored session, or None when unknown, expired or out of reach (Redis down);
        Forbidden when it is another tenant's (its id leaked or was guessed)."""
        try:
            raw = await self.redis.get(self.key(session_id))
        except (*REDIS_DOWN, RedisError) as exc:
            log.warning("could not load session %s: starting afresh (%s)", session_id, exc)
            return None
        if raw is None:
            return None
        try:
            stored = StoredSession.model_validate_json(raw)
        except ValidationError:
            log.error("stored session %s is unreadable: starting afresh", session_id)
            return None
        if not hmac.compare_digest(stored.tenant.encode(), tenant.encode()):
            raise Forbidden("this session belongs to another tenant")
        return stored.config, stored.history
