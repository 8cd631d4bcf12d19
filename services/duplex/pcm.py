"""`WS /v1/stream/duplex`: PCM16 in, PCM16 and the agent's text out (docs/duplex.md).

The endpoint a gateway backend uses: binary frames of raw PCM16 mono at
`input_sample_rate`, any length; binary frames of the agent's speech at
`output_sample_rate`, one per 80 ms model step; `text.delta` events for the agent's
words, each just before the audio frame it came with.
"""

from __future__ import annotations

import asyncio

from fastapi import WebSocket

from services.common.audio.pcm import (
    check_sample_rate,
    float_to_pcm16,
    pcm16_to_float,
)
from services.common.audio.polyphase import PolyphaseResampler
from services.common.auth.credentials import app_subprotocol
from services.common.auth.guard import meter_of
from services.common.auth.limits import AudioMeter
from services.common.errors import UnsupportedSampleRate, VoiceAgentError
from services.common.protocol.duplex import DuplexReady, TextDelta, parse_client
from services.common.service.routes import ServiceState
from services.common.service.ws import Channel, Disconnected, ReadAhead, failing_typed
from services.duplex.framing import ClientAudio
from services.duplex.session import DuplexSession, held_slot, read_ahead
from services.duplex.stepper import Stepper

FRAME_MS = 80


class ClientClosed(Exception):
    """The client sent `close`."""


async def _read(
    channel: Channel,
    frames: ReadAhead,
    session: DuplexSession,
    audio: ClientAudio,
    meter: AudioMeter,
    rate: int,
) -> None:
    """Handle the client's frames, as `read_ahead` gets them, until it closes (ClientClosed)
    or leaves (Disconnected)."""
    while True:
        frame = await frames.get()
        try:
            if frame.data is not None:
                await meter.add_pcm16(len(frame.data), rate)
                await session.hear(audio.push(pcm16_to_float(frame.data)))
                continue
            parse_client(frame.text or "")
            raise ClientClosed
        except VoiceAgentError as exc:
            if exc.fatal:
                raise
            await channel.send_error(exc)  # one bad message; the session goes on


async def _write(channel: Channel, session: DuplexSession, out: PolyphaseResampler) -> None:
    frames = 0
    while True:
        said = await session.said()
        if said.text:
            await channel.send(TextDelta(delta=said.text, audio_ms=frames * FRAME_MS))
        if said.audio is not None:
            await channel.send_audio(float_to_pcm16(out.process(said.audio)))
            frames += 1


async def serve_pcm_stream(
    ws: WebSocket,
    state: ServiceState,
    stepper: Stepper,
    max_frame_bytes: int,
    input_rate: int,
    output_rate: int,
) -> None:
    """Accept, admit (close 1013 when every slot is taken) and serve one session."""
    await ws.accept(subprotocol=app_subprotocol(ws.scope.get("subprotocols")))
    channel = Channel(ws, "duplex", max_frame_bytes)
    try:
        check_sample_rate(input_rate)
        check_sample_rate(output_rate)
    except UnsupportedSampleRate as exc:
        exc.fatal, exc.close_code = True, 1008
        await channel.fail(exc)
        return
    engine = stepper.engine
    async with (
        failing_typed(channel.fail, "duplex session", (Disconnected, ClientClosed)),
        held_slot(stepper, state, "pcm") as session,
    ):
        ready = DuplexReady(
            session_id=session.id,
            input_sample_rate=input_rate,
            output_sample_rate=output_rate,
            engine=engine.name,
            model=engine.model,
        )
        await channel.send(ready)
        audio = ClientAudio(input_rate, engine.sample_rate, engine.frame_samples)
        out = PolyphaseResampler(engine.sample_rate, output_rate)
        frames = ReadAhead()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(read_ahead(channel, frames, session), name="duplex-in")
            tasks.create_task(_write(channel, session, out), name="duplex-out")
            await _read(channel, frames, session, audio, meter_of(ws), input_rate)
    await channel.close(1000)  # nothing when it failed: closed already
