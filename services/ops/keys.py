"""`voice-agent keys create|list|revoke`: API keys of the deployment in `VA_REDIS__URL`.

The plain key is printed once, by `create`, and kept nowhere: Redis holds its SHA-256.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError
from redis.exceptions import RedisError

from services.common.auth.api_keys import ApiKey, KeyStore
from services.common.auth.settings import Limits
from services.common.bus.connection import connect
from services.common.errors import VoiceAgentError
from services.ops.registry import load_settings

LIMIT_FLAGS = {
    "sessions": "concurrent WebSocket sessions",
    "sessions_per_minute": "new WebSocket sessions per minute",
    "requests_per_minute": "REST requests per minute",
    "audio_seconds_per_day": "seconds of audio heard per UTC day",
}


def add_keys_command(sub: Any) -> None:
    """Register `keys` and its sub-commands on the top-level parser."""
    p_keys = sub.add_parser("keys", help="create, list or revoke API keys")
    actions = p_keys.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="make a key (printed once)")
    create.add_argument("--tenant", required=True, help="whose key: 1-64 of A-Z a-z 0-9 _ . -")
    create.add_argument("--name", default="", help="a label to tell keys apart")
    for name, meaning in LIMIT_FLAGS.items():
        flag = "--" + name.replace("_", "-")
        help_text = f"{meaning} (default: VA_AUTH__LIMITS__...)"
        create.add_argument(flag, type=_limit(name), help=help_text, metavar="N")
    listing = actions.add_parser("list", help="every key (never the secret)")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    revoke = actions.add_parser("revoke", help="revoke a key and the client tokens it signed")
    revoke.add_argument("key_id", help="the id `list` shows (the part after `va_`)")
    p_keys.set_defaults(func=keys_command)


def _limit(name: str) -> Callable[[str], int]:
    """An argparse type: a whole number within the bounds `Limits` sets for `name`."""

    def parse(text: str) -> int:
        try:
            return int(Limits.model_validate({name: int(text)}).model_dump()[name])
        except ValueError as exc:  # not a number, or out of bounds (ValidationError)
            why = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else "not a number"
            raise argparse.ArgumentTypeError(f"{text!r}: {why}") from None

    parse.__name__ = "limit"
    return parse


def keys_command(args: argparse.Namespace) -> None:
    try:
        asyncio.run(_with_store(ACTIONS[args.action], args))
    except VoiceAgentError as exc:
        raise SystemExit(f"voice-agent keys {args.action}: {exc.message}") from None
    except (RedisError, OSError) as exc:
        raise SystemExit(
            f"voice-agent keys {args.action}: cannot reach Redis ({exc}): is it running, "
            "and is VA_REDIS__URL the deployment's?"
        ) from None


async def _with_store(
    action: Callable[[KeyStore, argparse.Namespace], Awaitable[None]], args: argparse.Namespace
) -> None:
    settings = load_settings("gateway")
    try:
        redis = connect(settings.redis)
    except ValueError as exc:  # a URL the bus cannot use (parse_url)
        raise SystemExit(f"voice-agent keys {args.action}: VA_REDIS__URL: {exc}") from None
    try:
        await action(KeyStore(redis, settings.redis.prefix), args)
    finally:
        await redis.aclose()


async def _create(store: KeyStore, args: argparse.Namespace) -> None:
    limits = Limits(**{name: getattr(args, name) for name in LIMIT_FLAGS})
    record, plain = await store.create(args.tenant, args.name, limits)
    print(plain)
    print(
        f"key {record.id} for tenant {record.tenant}: shown once, keep it secret "
        "(revoke with `voice-agent keys revoke " + record.id + "`)",
        file=sys.stderr,
    )


def _line(key: ApiKey) -> str:
    state = "revoked" if key.revoked_at is not None else "active"
    limits = " ".join(f"{k}={v}" for k, v in key.limits.model_dump(exclude_none=True).items())
    return f"{key.id}  {key.tenant:<20} {state:<8} {key.name!r} {limits}".rstrip()


async def _list(store: KeyStore, args: argparse.Namespace) -> None:
    for key in await store.list():
        print(json.dumps(key.public()) if args.json else _line(key))


async def _revoke(store: KeyStore, args: argparse.Namespace) -> None:
    if not await store.revoke(args.key_id):
        raise SystemExit(f"voice-agent keys revoke: no key {args.key_id!r}")
    print(f"revoked {args.key_id}")


ACTIONS: dict[str, Callable[[KeyStore, argparse.Namespace], Awaitable[None]]] = {
    "create": _create,
    "list": _list,
    "revoke": _revoke,
}
