"""`WS /api/chat`: Moshi's own protocol, so Moshi (and PersonaPlex) web clients work as they
are (docs/duplex.md).

Every message is one kind byte and a payload: the server sends 0x00 (handshake) once the
session holds a slot; 0x01 carries Ogg/Opus audio (24 kHz mono) both ways; 0x02 the
agent's text as UTF-8; 0x05 an error (bytes that are not Ogg/Opus: close 1007). Other kinds
are ignored, as the protocol says.
Opus is encoded and decoded with `sphn`, as moshi's reference server does, off the
event loop. Per-session sampling parameters in the query (`text_temperature`, ...) are
accepted and ignored: one batch shares the service's settings.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from typing import Any, Final

import numpy as np
from fastapi import WebSocket

from services.common import metrics as common_metrics
from services.common.auth.guard import meter_of
from services.common.auth.limits import AudioMeter
from services.common.errors import (
    EngineUnavailable,
    InvalidAudio,
    VoiceAgentError,
)
from services.common.service.routes import ServiceState
from services.common.service.ws import Channel, ReadAhead, failing_typed
from services.duplex.framing import FrameAssembler
from services.duplex.session import DuplexSession, held_slot, read_ahead
from services.duplex.stepper import Stepper

log = logging.getLogger(__name__)

HANDSHAKE: Final = b"\x00"
AUDIO: Final = 0x01
TEXT: Final = b"\x02"
ERROR: Final = b"\x05"


def _sphn() -> Any:
    try:
        return importlib.import_module("sphn")
    except ImportError as exc:
        raise EngineUnavailable(
            f"/api/chat needs sphn for Opus ({exc}): run the service from .venv-duplex "
            "(make install-duplex)"
        ) from exc


class NotOpus(InvalidAudio):
    """Audio bytes sphn cannot read as Ogg/Opus: the stream cannot go on (close 1007)."""

    close_code = 1007
    fatal = True


async def _read(
    received: ReadAhead,
    session: DuplexSession,
    opus: Any,
    frames: FrameAssembler,
    meter: AudioMeter,
    rate: int,
) -> None:
    """Handle the client's messages, as `read_ahead` gets them, until it leaves."""
    while True:
        data = (await received.get()).data
        if not data or data[0] != AUDIO:
            continue  # text frames, empty messages and other kinds: discarded (the protocol)
        try:
            pcm = await asyncio.to_thread(opus.append_bytes, data[1:])
        except ValueError as exc:  # sphn's word for a page it cannot parse
            raise NotOpus(f"audio (kind 0x01) must be Ogg/Opus pages: {exc}") from None
        if pcm.size:
            await meter.add_pcm16(2 * int(pcm.size), rate)
            await session.hear(frames.push(np.asarray(pcm, np.float32)))


async def _write(channel: Channel, session: DuplexSession, opus: Any) -> None:
    while True:
        said = await session.said()
        if said.audio is not None:
            packet = await asyncio.to_thread(opus.append_pcm, said.audio)
            if packet:
                await channel.send_audio(bytes([AUDIO]) + packet)
        if said.text:
            await channel.send_audio(TEXT + said.text.encode())


async def _fail(channel: Channel, exc: VoiceAgentError) -> None:
    """An error as Moshi clients read one (kind 0x05), then the close code."""
    log.info("/api/chat session ends: %s (%s)", exc.message, exc.code)
    common_metrics.ERRORS.labels("duplex", exc.code).inc()
    await channel.send_audio(ERROR + exc.message.encode())
    await channel.close(exc.close_code, exc.message)


async def serve_moshi_chat(
    ws: WebSocket, state: ServiceState, stepper: Stepper, max_frame_bytes: int
) -> None:
    """Accept, admit (0x05 and close 1013 when every slot is taken) and serve one session."""
    await ws.accept()
    channel = Channel(ws, "duplex", max_frame_bytes)
    rate = stepper.engine.sample_rate

    async def fail(exc: VoiceAgentError) -> None:
        await _fail(channel, exc)

    async with failing_typed(fail, "/api/chat session"):
        sphn = _sphn()
        async with held_slot(stepper, state, "moshi") as session:
            reader, writer = sphn.OpusStreamReader(rate), sphn.OpusStreamWriter(rate)
            frames = FrameAssembler(stepper.engine.frame_samples)
            await channel.send_audio(HANDSHAKE)
            received = ReadAhead()
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(read_ahead(channel, received, session), name="moshi-in")
                tasks.create_task(_write(channel, session, writer), name="moshi-out")
                await _read(received, session, reader, frames, meter_of(ws), rate)
    await channel.close(1000)  # nothing when it failed: closed already
