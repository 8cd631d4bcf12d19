"""Shared fixtures: a real Redis per test session and a real lite stack on free ports."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from services.common.auth.limits import seconds_to_midnight_utc
from services.common.bus.settings import RedisSettings
from services.common.service.settings import Profile
from services.ops.redis_server import free_port, start_redis
from tests.servers import ServerThread

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The suite predates authentication: services it starts (in process or as subprocesses) run
# with it off unless a test turns it on (`AuthSettings(required=True)`, tests/e2e/test_auth.py).
os.environ.setdefault("VA_AUTH__REQUIRED", "false")
# The gateway reads OPENAI_BASE_URL/OPENAI_API_KEY (docs/agents.md): a developer's own must
# not make the suite's gateways probe an LLM and answer with it instead of `echo`.
for _variable in ("OPENAI_BASE_URL", "OPENAI_API_KEY"):
    os.environ.pop(_variable, None)


@dataclass
class RedisProc:
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def settings(self, **overrides: object) -> RedisSettings:
        return RedisSettings(url=self.url, prefix=f"t{uuid.uuid4().hex[:8]}", **overrides)  # type: ignore[arg-type]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProc]:
    """A real redis-server of our own, on a free port."""
    port = free_port()
    server = RedisProc(port, start_redis(port, tmp_path_factory.mktemp("redis")))
    yield server
    server.stop()


@pytest.fixture
def one_utc_day() -> None:
    """For a test that charges a daily audio quota and reads it back: it starts at least a
    minute before 00:00 UTC (it waits past midnight otherwise), so all it charges falls on
    one day's counter, whatever time the suite runs at."""
    left = seconds_to_midnight_utc()
    if left < 60:
        time.sleep(left + 1)


@dataclass
class Stack:
    asr: ServerThread
    tts: ServerThread
    gateway: ServerThread
    redis: RedisSettings

    @property
    def stream_url(self) -> str:
        return f"{self.gateway.ws}/v1/stream"

    @property
    def servers(self) -> dict[str, ServerThread]:
        """Each server by the service name its /health reports."""
        return {"asr": self.asr, "tts": self.tts, "gateway": self.gateway}


@contextmanager
def start_stack(redis: RedisSettings, profile: Profile = "lite") -> Iterator[Stack]:
    """ASR, TTS and the gateway of one profile, joined by `redis`."""
    from services.asr.app import create_app as asr_app
    from services.asr.settings import AsrSettings
    from services.gateway.app import create_app as gateway_app
    from services.tts.app import create_app as tts_app
    from services.tts.settings import TtsSettings

    with (
        ServerThread(asr_app(AsrSettings(profile=profile, redis=redis))) as asr,
        ServerThread(tts_app(TtsSettings(profile=profile, redis=redis))) as tts,
        ServerThread(gateway_app(_gateway_settings(profile, redis, tts.http))) as gateway,
    ):
        yield Stack(asr, tts, gateway, redis)


def _gateway_settings(profile: Profile, redis: RedisSettings, tts_url: str) -> Any:
    """The gateway of a test stack: it lists the stack's own TTS voices at /v1/voices. Its
    admission by voice-to-voice is off: the tests share a busy machine, whose slowness is
    not the sessions' load (tests/e2e/test_admission.py tests admission on its own)."""
    from services.gateway.admission import AdmissionSettings
    from services.gateway.settings import GatewaySection, GatewaySettings

    section = GatewaySection(tts_url=tts_url, admission=AdmissionSettings(enabled=False))
    return GatewaySettings(profile=profile, redis=redis, gateway=section)


@pytest.fixture(scope="session")
def lite_stack(redis_server: RedisProc) -> Iterator[Stack]:
    """ASR (faster-whisper tiny.en), TTS (Piper) and the gateway, joined by a real Redis."""
    with start_stack(redis_server.settings()) as stack:
        yield stack
