"""Tenants: the name every stored thing and every credential belongs to."""

from __future__ import annotations

import re
from typing import Final

DEFAULT_TENANT: Final = "default"
"""The tenant of everything when authentication is off, and of data made before it."""
TENANT: Final = re.compile(r"\A[A-Za-z0-9_.-]{1,64}\Z")
"""What a tenant name may be, the whole string (`$` would also match before a final
newline, and "acme" with a newline after it would be a tenant of its own)."""
