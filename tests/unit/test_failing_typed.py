"""`failing_typed`: however a connection's serving ends, the client is told in its own
protocol, and a bug is never a bare close."""

from __future__ import annotations

import asyncio
import logging

import pytest

from services.common.errors import CapacityError, VoiceAgentError
from services.common.service.ws import Disconnected, failing_typed


class Told:
    def __init__(self) -> None:
        self.errors: list[VoiceAgentError] = []

    async def fail(self, exc: VoiceAgentError) -> None:
        self.errors.append(exc)


async def _serve(told: Told, raised: BaseException | None) -> None:
    async def task() -> None:
        if raised is not None:
            raise raised

    async with failing_typed(told.fail, "the stream"), asyncio.TaskGroup() as tasks:
        tasks.create_task(task())


async def test_the_client_gone_or_a_clean_end_tells_nothing() -> None:
    told = Told()
    await _serve(told, Disconnected())
    await _serve(told, None)
    assert told.errors == []


async def test_a_domain_error_is_told_as_it_is() -> None:
    told = Told()
    refused = CapacityError("full", retry_after_s=3)
    await _serve(told, refused)
    assert told.errors == [refused]


async def test_a_bug_is_a_fatal_internal_error_naming_only_its_kind(
    caplog: pytest.LogCaptureFixture,
) -> None:
    told = Told()
    with caplog.at_level(logging.ERROR):
        await _serve(told, KeyError("a secret detail"))
    [error] = told.errors
    assert (error.code, error.fatal, error.close_code) == ("internal", True, 1011)
    assert error.message == "internal error (KeyError)"
    assert "the stream failed" in caplog.text and "a secret detail" in caplog.text


async def test_a_cancellation_goes_on_up_untold() -> None:
    told = Told()
    with pytest.raises(asyncio.CancelledError):
        async with failing_typed(told.fail, "the stream"):
            raise asyncio.CancelledError
    assert told.errors == []
