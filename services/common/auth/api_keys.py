"""API keys in Redis: one hash per key (`<prefix>:auth:key:<id>`: tenant, name, the SHA-256
of its secret, limits, revocation) and a set of ids (`<prefix>:auth:keys`). The plain key
exists only in the answer to `create`."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any, Literal

from redis.asyncio import Redis

from services.common.auth.credentials import (
    Principal,
    hash_matches,
    new_key,
    split_key,
    verify_token,
)
from services.common.auth.settings import Limits
from services.common.bus.connection import is_cluster
from services.common.bus.keys import Keys
from services.common.errors import InvalidMessage, Unauthorized
from services.common.tenancy import TENANT


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One key's record (never its secret)."""

    id: str
    tenant: str
    name: str
    created_at: float
    limits: Limits
    revoked_at: float | None = None

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "tenant": self.tenant,
            "name": self.name,
            "created_at": self.created_at,
            "revoked": self.revoked_at is not None,
            "limits": self.limits.model_dump(exclude_none=True),
        }


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class KeyStore:
    """Creates, lists, revokes and checks API keys; holds the token signing secret."""

    def __init__(self, redis: Redis, prefix: str, token_secret: str = "") -> None:
        self.redis = redis
        self.prefix = prefix
        self.keys = Keys(prefix)
        self._secret = token_secret.encode() if token_secret else b""

    def _key(self, key_id: str) -> str:
        return self.keys.api_key(key_id)

    @property
    def _index(self) -> str:
        return self.keys.api_key_index()

    async def create(
        self, tenant: str, name: str, limits: Limits | None = None
    ) -> tuple[ApiKey, str]:
        """A new key and its plain form (shown once)."""
        if not TENANT.match(tenant):
            raise InvalidMessage("a tenant is 1 to 64 of A-Z a-z 0-9 _ . -")
        key_id, plain, digest = new_key()
        record = ApiKey(key_id, tenant, name[:128], time.time(), limits or Limits())
        # MULTI across the record and the index needs one slot; on a Cluster they are on
        # two, so there the two writes go unbatched (a crash between them leaves a key
        # that works but is not listed) — docs/redis-ha.md
        async with self.redis.pipeline(transaction=not is_cluster(self.redis)) as pipe:
            pipe.hset(
                self._key(key_id),
                mapping={
                    "tenant": tenant,
                    "name": record.name,
                    "hash": digest,
                    "created_at": repr(record.created_at),
                    "limits": record.limits.model_dump_json(exclude_none=True),
                },
            )
            pipe.sadd(self._index, key_id)
            await pipe.execute()
        return record, plain

    async def get(self, key_id: str) -> tuple[ApiKey, str] | None:
        """A key's record and stored hash, or None."""
        raw = await self.redis.hgetall(self._key(key_id))
        if not raw:
            return None
        fields = {_text(k): _text(v) for k, v in raw.items()}
        revoked = fields.get("revoked_at")
        record = ApiKey(
            id=key_id,
            tenant=fields["tenant"],
            name=fields.get("name", ""),
            created_at=float(fields.get("created_at", 0)),
            limits=Limits.model_validate_json(fields.get("limits") or "{}"),
            revoked_at=float(revoked) if revoked else None,
        )
        return record, fields.get("hash", "")

    async def list(self) -> list[ApiKey]:
        ids = sorted(_text(v) for v in await self.redis.smembers(self._index))
        found = [await self.get(key_id) for key_id in ids]
        return sorted((f[0] for f in found if f is not None), key=lambda k: k.created_at)

    async def revoke(self, key_id: str) -> bool:
        """Revoke a key (and every client token it signed); False when there is none."""
        if await self.get(key_id) is None:
            return False
        await self.redis.hset(self._key(key_id), "revoked_at", repr(time.time()))
        return True

    async def active(self, key_id: str) -> ApiKey:
        found = await self.get(key_id)
        if found is None or found[0].revoked_at is not None:
            raise Unauthorized("the API key is unknown or revoked")
        return found[0]

    async def verify_key(self, plain: str) -> ApiKey:
        """The record of a valid, unrevoked key; Unauthorized otherwise."""
        parts = split_key(plain)
        if parts is None:
            raise Unauthorized("malformed API key")
        found = await self.get(parts[0])
        if found is None or not hash_matches(parts[1], found[1]):
            raise Unauthorized("invalid API key")
        if found[0].revoked_at is not None:
            raise Unauthorized("the API key is revoked")
        return found[0]

    async def signing_secret(self) -> bytes:
        """The token secret: the setting, else one made once and kept in Redis."""
        if not self._secret:
            name = self.keys.signing_secret()
            await self.redis.set(name, secrets.token_urlsafe(48), nx=True)
            stored = await self.redis.get(name)
            if stored is None:
                raise Unauthorized("no token signing secret")
            self._secret = stored if isinstance(stored, bytes) else str(stored).encode()
        return self._secret

    async def principal(self, credential: str, defaults: Limits) -> Principal:
        """Who `credential` (an API key or a client token) is; Unauthorized when no one."""
        if credential.startswith("va_"):
            key = await self.verify_key(credential)
            return Principal(key.tenant, "key", key.id, key.limits.over(defaults))
        claims = verify_token(await self.signing_secret(), credential)
        key = await self.active(claims["kid"])  # a revoked key's tokens die with it
        if key.tenant != claims["sub"]:
            raise Unauthorized("invalid client token")
        kind: Literal["token", "relay"] = "relay" if claims.get("relay") else "token"
        return Principal(
            key.tenant, kind, key.id, key.limits.over(defaults), claims.get("session", {})
        )
