"""A caller's identity carried to a service behind the one it called.

The gateway in front of the duplex service (and any relay like it) admitted the caller,
counts its session and its audio, and opens its own connection to the service behind. That
service must still see the caller's tenant (its guard checks, its logs and its per-tenant
state name it), but must not count the same session and audio a second time, and should
not receive the caller's long-lived API key. So the relaying service signs a relay token:
a client token (60 s, the caller's tenant and key, revoked with the key) with a `relay`
claim, sent as `Authorization: Bearer`. The guard behind takes it without counting; an
edge (the gateway) refuses it.
"""

from __future__ import annotations

from typing import Final

from starlette.requests import HTTPConnection

from services.common.auth.api_keys import KeyStore
from services.common.auth.credentials import sign_token
from services.common.auth.guard import principal_of

RELAY_TTL_S: Final = 60
"""A relay token is checked when the connection behind opens, and used once."""


async def relay_headers(conn: HTTPConnection, keys: KeyStore) -> dict[str, str]:
    """Headers for a request or WebSocket to a service behind this one, on behalf of the
    caller of `conn` (none when authentication is off here: the caller is anonymous)."""
    principal = principal_of(conn)
    if principal.kind == "anonymous" or principal.key_id is None:
        return {}
    token, _ = sign_token(
        await keys.signing_secret(), principal.tenant, principal.key_id, RELAY_TTL_S, {}, True
    )
    return {"Authorization": f"Bearer {token}"}
