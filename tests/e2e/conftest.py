"""Fixtures of more than one end-to-end module."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def browser(chromium: Any) -> Iterator[Any]:
    """A fresh context of the module's own Chromium (`chromium`: its microphone's wav)."""
    from tests.e2e.test_browser import new_context

    context = new_context(chromium)
    try:
        yield context
    finally:
        context.close()
