"""Tenants: the name every stored thing and every credential belongs to."""

from __future__ import annotations

import re
from typing import Final

DEFAULT_TENANT: Final = "default"
"""The tenant of everything when authentication is off, and of data made before it."""
TENANT: Final = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
"""What a tenant name may be."""
