"""What a web page in a browser may make a service do: the checks that hold whether
authentication is on or off.

- **Origin.** A WebSocket upgrade and a state-changing HTTP request (anything but GET, HEAD
  and OPTIONS) that carry an `Origin` must come from the page's own host or from the
  configured allowed origins. A browser sends `Origin` with every such request; clients
  that are not browsers send none and are unaffected. (A cross-site `POST` with a form or
  plain-text body needs no CORS preflight: without this check a page could make one.)
- **Host, with authentication off.** A page on a name its attacker controls can make that
  name resolve to 127.0.0.1 (DNS rebinding): its requests are then "same-origin" (Origin
  and Host both name it) and reach a loopback service. Rebinding needs a DNS name its
  attacker controls, so with authentication off a request whose `Host` is a dotted name
  (`evil.example`) is refused, unless it is a `*.localhost` name or the host of an allowed
  origin. IP literals are fine, and so are single-label names (`localhost`, a test
  client's `testserver`): they resolve only through this host's own resolver (hosts file,
  search domains), never a zone on the internet.
- **Local callers** (`/admin/drain`, for the host's own preStop hook or operator): the peer
  is a loopback address and the request carries neither an `Origin` (a browser on the host
  is loopback too) nor a forwarding header (`X-Forwarded-For`, `Forwarded`, `X-Real-IP`:
  a proxy relayed it, and uvicorn may have rewritten the peer's address from one).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urlsplit

from services.common.auth.credentials import is_loopback

SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
"""Methods that change nothing: a cross-site page may send them (it cannot read the answer
without CORS)."""
FORWARDING_HEADERS: Final = frozenset({"x-forwarded-for", "forwarded", "x-real-ip"})


def headers_of(scope: Mapping[str, Any]) -> dict[str, str]:
    """The request's headers, names lower-cased (the first of a repeated one)."""
    found: dict[str, str] = {}
    for name, value in scope.get("headers", ()):
        found.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
    return found


def changes_state(scope: Mapping[str, Any]) -> bool:
    """A WebSocket upgrade, or an HTTP request with a method other than GET/HEAD/OPTIONS."""
    if scope.get("type") == "websocket":
        return True
    return str(scope.get("method") or "GET").upper() not in SAFE_METHODS


def origin_allowed(scope: Mapping[str, Any], allowed: list[str]) -> bool:
    """No Origin (not a browser), the page's own host, or one of `allowed` (`*`: any)."""
    headers = headers_of(scope)
    origin = headers.get("origin")
    if origin is None or "*" in allowed:
        return True
    origin = origin.strip().rstrip("/").lower()
    if origin in {a.rstrip("/").lower() for a in allowed}:
        return True
    host = headers.get("host", "").strip().lower()
    return bool(host) and urlsplit(origin).netloc == host


def _host_name(host: str) -> str:
    """The name part of a Host header (`[::1]:8000` → `::1`, `a.example:80` → `a.example`)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def host_allowed(scope: Mapping[str, Any], allowed: list[str]) -> bool:
    """With authentication off: the Host names no DNS name a page could rebind (none sent,
    an IP literal, a single-label name such as `localhost`, a `*.localhost` name, or the host
    of an allowed origin)."""
    host = headers_of(scope).get("host")
    if host is None:
        return True
    name = _host_name(host)
    if _is_ip(name) or "." not in name.rstrip(".") or name.rstrip(".").endswith(".localhost"):
        return True
    return name in {(urlsplit(a.strip()).hostname or "") for a in allowed}


def local_caller(scope: Mapping[str, Any]) -> bool:
    """A caller on this host itself, not relayed by a proxy and not a browser's page."""
    client = scope.get("client")
    if not client or not is_loopback(str(client[0])):
        return False
    headers = headers_of(scope)
    return "origin" not in headers and not FORWARDING_HEADERS & headers.keys()
