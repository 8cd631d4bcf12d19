"""The services as the operator tools see them: each one's settings and its entry point.

The tools (`voice-agent up|asr|tts|gateway|duplex|config|doctor`) sit above the services and
import them; the services import only `services.common` (the layering rule, checked by
import-linter in `make test`).
"""

from __future__ import annotations

from dataclasses import dataclass

from services.asr.settings import AsrSettings
from services.common.service.settings import BaseServiceSettings, ServerSettings
from services.duplex.settings import DuplexSettings
from services.gateway.settings import GatewaySettings
from services.tts.settings import TtsSettings


@dataclass(frozen=True)
class Service:
    """One service: its settings class, the section holding `server`, its entry module."""

    name: str
    settings: type[BaseServiceSettings]
    section: str
    in_stack: bool = True
    """Started by `voice-agent up` (the cascaded stack); the duplex service runs from its
    own environment and is started on its own."""

    @property
    def module(self) -> str:
        """`python -m` this to run the service (its `server.py`)."""
        return f"services.{self.name}.server"


SERVICES: dict[str, Service] = {
    "asr": Service("asr", AsrSettings, "asr"),
    "tts": Service("tts", TtsSettings, "tts"),
    "gateway": Service("gateway", GatewaySettings, "gateway"),
    "duplex": Service("duplex", DuplexSettings, "duplex", in_stack=False),
}
STACK: dict[str, Service] = {name: s for name, s in SERVICES.items() if s.in_stack}
"""The services `voice-agent up` starts (the cascade's)."""


def up_services() -> dict[str, Service]:
    """The services `voice-agent up` starts with these settings: the cascade's (ASR, TTS,
    gateway), or the duplex service and a gateway in front of it when the gateway's backend
    is `duplex` (VA_PROFILE=duplex)."""
    if GatewaySettings().gateway.backend == "duplex":
        return {"duplex": SERVICES["duplex"], "gateway": SERVICES["gateway"]}
    return STACK


def load_settings(service: str) -> BaseServiceSettings:
    """The service's settings, read from the environment (`VA_...`)."""
    return SERVICES[service].settings()


def server_section(settings: BaseServiceSettings, service: str) -> ServerSettings:
    """The `server` section of a service's settings."""
    section: ServerSettings = getattr(settings, SERVICES[service].section).server
    return section
