"""Secrets never reach a log line: a filter on the loggers that quote requests.

uvicorn logs each WebSocket handshake with its path and query string, so a client token
sent as `?access_token=` would land in the log; the filter replaces the whole query string
of every request line (`"WebSocket /v1/stream?..."`, `"GET /x?..."`) with `[redacted]`,
and API keys, client tokens (JWTs) and `access_token` values anywhere else, also when
percent-encoded (`access%5Ftoken=`, `%2E` for a JWT's dots: the services decode the query
before they read it), in every record of those loggers and of the root logger. It also
drops uvicorn's "returned without completing handshake" error, which uvicorn logs after
every refused upgrade (an ASGI denial response): anyone could otherwise fill the error log
just by failing authentication.
"""

from __future__ import annotations

import logging
import re
from typing import Final
from urllib.parse import unquote, urlsplit, urlunsplit

SECRET_PATTERNS: Final = (
    re.compile(r"va_[0-9a-f]{12}_[A-Za-z0-9_-]{20,}"),
    re.compile(r"eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*"),
    re.compile(r"(?<=access_token=)[^&\s\"']+"),
    re.compile(r"(?<=voice-agent\.token\.)[^,\s\"']+"),
    re.compile(r"(?i)(?<=bearer )[^\s\"']+"),
)
REQUEST_QUERY: Final = re.compile(
    r"\b((?:WebSocket|GET|HEAD|POST|PUT|PATCH|DELETE|OPTIONS|CONNECT|TRACE) [^\s?\"']*)"
    r"\?[^\s\"']*"
)
"""A request line's path and query (as uvicorn quotes it): the query goes, whatever it holds."""
DECODE_ROUNDS: Final = 3
"""How many layers of percent-encoding are undone to find a credential hidden in one."""
_DENIAL_NOISE: Final = "ASGI callable returned without completing handshake."
LOGGERS: Final = ("", "uvicorn", "uvicorn.error", "uvicorn.access", "websockets")


URL: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
"""A URL inside free text (an exception's message, say)."""


def redact_url(url: str, mark: str = "***") -> str:
    """`url` for people (notices, logs): its user info, where credentials hide, replaced by
    `mark`, its query string by `***` (both left out when `mark` is ""), its fragment
    dropped."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<url>"
    _, at, host = parts.netloc.rpartition("@")
    netloc = f"{mark}@{host}" if at and mark else host
    query = "***" if parts.query and mark else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def redact_urls(text: str) -> str:
    """`text` with every URL in it as `redact_url` writes it."""
    return URL.sub(lambda m: redact_url(m.group()), text)


def _redact_plain(text: str) -> str:
    text = REQUEST_QUERY.sub(r"\1?[redacted]", text)
    for pattern in SECRET_PATTERNS:
        text = pattern.sub("[redacted]", text)
    return text


CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")
"""Characters a decoded text must not bring into a log line (a newline would start a line
its sender wrote)."""


def redact(text: str) -> str:
    """`text` with every request line's query string and every credential-shaped part
    replaced; a credential found only once percent-decoded is replaced in the decoded text,
    which is then what is kept, its control characters percent-encoded again."""
    cleaned = _redact_plain(text)
    decoded, hidden = cleaned, False
    for _ in range(DECODE_ROUNDS):
        if "%" not in decoded:
            break
        decoded = unquote(decoded)
        found = _redact_plain(decoded)
        hidden = hidden or found != decoded
        decoded = found
    if not hidden:
        return cleaned
    return CONTROL.sub(lambda m: f"%{ord(m.group()):02X}", decoded)


class RedactSecrets(logging.Filter):
    """Rewrites a record whose message holds a credential; drops the denial noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == _DENIAL_NOISE:
            return False
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            return True
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, ()
        return True


def install_redaction() -> None:
    """Put the filter on the request-quoting loggers and on the root logger's handlers
    (which every propagated record passes), once per process."""
    targets: list[logging.Filterer] = [logging.getLogger(name) for name in LOGGERS]
    targets += logging.getLogger().handlers
    for target in targets:
        if not any(isinstance(f, RedactSecrets) for f in target.filters):
            target.addFilter(RedactSecrets())
