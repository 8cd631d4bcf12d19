"""A `/v1/stream` or `/v1/realtime` session answered by the full-duplex service.

With `backend: duplex` each session is one connection to the duplex service
(duplex_link.py): the client's audio goes there as it comes, the agent's audio and text come
back as the model makes them, one 80 ms frame at a time. The model hears and speaks at
once, so there are no turns to detect, no ASR, agent or TTS jobs, and barge-in is the
model's own (it stops or goes on as it decides; there is no `output_audio.clear`). What the
client's protocol still gets, through the same codecs as the cascade (codec.py): PCM16 in
and out at the session's rates (resampled here, so `session.update` changes them without
losing the model's state), the agent's words as `response.text.delta`, and the gateway's
own VAD reporting `speech.started`/`speech.stopped`. The whole session is one response
(`response.created` at the start, `response.done` at the end), so both codecs carry its
audio.

History: the agent's text between two starts of the user's speech is one agent turn (the
user's words are never transcribed), saved now and then and at the end, for resume. A
resumed session gets its settings back and a fresh model: the model has no memory of it.
"""

from __future__ import annotations

import asyncio
from typing import Literal

from services.common.audio.listener import Listener
from services.common.audio.pcm import float_to_pcm16, pcm16_to_float
from services.common.audio.polyphase import PolyphaseResampler
from services.common.audio.turns import SpeechEnd, SpeechStart, TurnEvent
from services.common.auth.limits import AudioMeter
from services.common.bus.messages import BusResult
from services.common.errors import (
    CapacityError,
    FrameTooBig,
    InvalidAudio,
    NotSupported,
    VoiceAgentError,
)
from services.common.protocol.duplex import TextDelta
from services.common.protocol.events import (
    InputAudioClear,
    InputAudioCommit,
    ResponseAudioDone,
    ResponseCreated,
    ResponseDone,
    ResponseTextDelta,
    SessionClose,
    SessionConfig,
    SessionUpdate,
    SessionUpdated,
    SpeechStarted,
    SpeechStopped,
)
from services.common.service.ws import Disconnected, ReadAhead
from services.gateway import metrics
from services.gateway.agent import Turn, keep_recent
from services.gateway.codec import AudioIn, AudioPlayed, ClientInput, SessionChannel, UserItem
from services.gateway.duplex_link import DuplexLink
from services.gateway.hearing import new_id, turn_settings
from services.gateway.settings import GatewaySection
from services.gateway.store import SessionStore

Status = Literal["completed", "failed"]
"""The session's one response: `completed` when the client closed it or left, `failed`
when it ended on an error (the duplex service's, mostly)."""


class SessionClosed(Exception):
    """The client asked to close the session."""


class DuplexSession:
    """One conversation on one WebSocket, answered by one duplex-service session."""

    def __init__(
        self,
        config: SessionConfig,
        channel: SessionChannel,
        listener: Listener,
        link: DuplexLink,
        settings: GatewaySection,
        store: SessionStore | None,
        tasks: asyncio.TaskGroup,
        *,
        tenant: str,
        meter: AudioMeter,
        history: list[Turn],
    ) -> None:
        self.config = config
        self.channel = channel
        self.listener = listener
        self.link = link
        self.settings = settings
        self.store = store
        self.tenant = tenant
        self.meter = meter
        self.history = history
        self.tasks = tasks
        self.response_id = new_id("resp")
        self.utterance_id: str | None = None
        self._said: list[str] = []  # the agent's text since the user last started speaking
        self._all_said: list[str] = []  # the response's text
        self._saved = 0  # len(_said) when last saved
        self._agent_samples = 0  # agent audio received, at the link's rate
        ready = link.ready
        self._frame_bytes = 2 * ready.input_sample_rate * ready.frame_ms // 1000
        self._unsent = bytearray()  # the user's audio short of a whole model frame
        self._to_model = PolyphaseResampler(config.input_sample_rate, ready.input_sample_rate)
        self._to_client = PolyphaseResampler(ready.output_sample_rate, config.output_sample_rate)
        if config.turn_detection is not None:  # a resumed session's own
            listener.set_turns(*turn_settings(listener.settings, config.turn_detection))
        self._frames = ReadAhead()
        """The client's frames, read ahead of their handling (serve)."""

    # ------------------------------------------------------------------ the session

    async def serve(self) -> None:
        """Carry audio both ways until the client leaves or closes the session, or the
        duplex service ends it (its error is raised). A task of its own reads the socket
        ahead of the handling (ReadAhead), as the cascade's sessions do: the client's close
        is read and answered at once, even while an input waits on Redis or on the duplex
        service; the handling ends at the next frame it asks for (Disconnected)."""
        await self.channel.send(ResponseCreated(response_id=self.response_id))
        name = self.config.id
        reader = self.tasks.create_task(
            self._frames.read(self.channel.io), name=f"{name}-duplex-reader"
        )
        helpers = [  # in the connection's task group: a failure there ends the session
            self.tasks.create_task(self._from_model(), name=f"{name}-duplex-out"),
            self.tasks.create_task(self._save_now_and_then(), name=f"{name}-duplex-save"),
            self.tasks.create_task(
                self.link.watch(self.settings.duplex_stall_timeout_s), name=f"{name}-duplex-watch"
            ),
        ]
        try:
            await self._serve_inputs(helpers)
            await self.channel.close(1000, "session closed")
        finally:
            reader.cancel()  # last: a close that comes while the session ends is answered

    async def take_over(self) -> None:
        """Another connection resumes this session (its client reconnected before this
        socket was found dead, or through another gateway, which then owns its record):
        this one is told and closed, and its handling ends as if its client had left (its
        duplex slot is freed and the session saved, for the new connection to load)."""
        await self.channel.close(1000, "resumed on another connection")
        await self._frames.end()

    async def _serve_inputs(self, helpers: list[asyncio.Task[None]]) -> None:
        """The client's inputs until it closes the session or leaves; then the end: the
        duplex slot freed, the history saved, the client told (if it is still there)."""
        status: Status = "failed"
        try:
            await self._from_client()
            status = "completed"
        except Disconnected:
            status = "completed"  # the client left: the conversation is over
            raise
        finally:
            for task in helpers:
                task.cancel()
            await self.link.close()
            self._end_agent_turn()
            await self._save()  # before the client hears the end: it may resume at once
            await self._end_response(status)

    def busy(self) -> bool:
        """Whether closing the session now would cut the user off (the gateway's VAD has an
        utterance open): a drain lets them finish before it closes it (1012). The agent's
        speech never ends by itself in full duplex: it is not waited for."""
        return self.utterance_id is not None

    def deliver(self, result: BusResult, audio: bytes | None) -> None:
        """No bus work is done for a duplex session: anything addressed to it is stale."""
        metrics.STALE_DROPPED.labels("duplex_session").inc()

    # ------------------------------------------------------------------ client → model

    async def _from_client(self) -> None:
        """Handle the client's inputs, as the reader gets them, until it closes the session
        (returns) or leaves (Disconnected)."""
        while True:
            for item in await self.channel.decode(await self._frames.get()):
                try:
                    await self._on_input(item)
                except SessionClosed:
                    return
                except VoiceAgentError as exc:
                    if exc.fatal:
                        raise
                    await self.channel.send_error(exc, answering=True)

    async def _on_input(self, item: ClientInput) -> None:
        match item:
            case AudioIn():
                await self._hear(item.pcm)
            case SessionUpdate():
                await self._update(item)
            case InputAudioCommit():
                end = self.listener.commit()
                if end is not None:
                    await self._on_turn_event(end)
            case InputAudioClear():
                self.listener.clear()
                self.utterance_id = None
            case SessionClose():
                raise SessionClosed
            case AudioPlayed():
                pass  # a telephone bridge's marks: the duplex model's playout is timed
            case _:  # response.create, conversation.text, response.cancel, and the like
                kind = "a text item" if isinstance(item, UserItem) else item.type
                raise NotSupported(
                    f"{kind} is not supported by the duplex backend: the model hears "
                    "and answers by itself, all the time (docs/duplex.md)"
                )

    async def _hear(self, pcm: bytes) -> None:
        """One frame of the user's audio: to the model first, then to the VAD. Checked
        here as the cascade's Listener checks it: the service must never refuse it."""
        rate = self.config.input_sample_rate
        if not pcm or len(pcm) % 2:
            raise InvalidAudio("an audio frame must hold whole PCM16 samples (at least one)")
        if len(pcm) > 2 * rate:
            raise FrameTooBig(f"audio frame of {len(pcm)} bytes is longer than 1 s at {rate} Hz")
        await self.meter.add_pcm16(len(pcm), rate)
        if rate == self.link.ready.input_sample_rate:
            await self._to_service(pcm)
        else:
            await self._to_service(float_to_pcm16(self._to_model.process(pcm16_to_float(pcm))))
        metrics.DUPLEX_AUDIO.labels("in").inc(len(pcm) / (2 * rate))
        for event in await self.listener.push_batched(pcm):
            await self._on_turn_event(event)

    async def _to_service(self, pcm: bytes) -> None:
        """Send whole model frames only: the model steps on nothing less, so a client's
        20 ms frames go as one message per 80 ms at no cost in latency (a quarter of the
        messages, system calls and wake-ups on both sides)."""
        self._unsent += pcm
        whole = len(self._unsent) // self._frame_bytes * self._frame_bytes
        if whole:
            chunk = bytes(self._unsent[:whole])
            del self._unsent[:whole]
            await self.link.send(chunk)

    async def _on_turn_event(self, event: TurnEvent) -> None:
        if isinstance(event, SpeechStart):
            self.utterance_id = new_id("utt")
            self._end_agent_turn()
            await self.channel.send(
                SpeechStarted(utterance_id=self.utterance_id, audio_start_ms=event.start_ms)
            )
        elif isinstance(event, SpeechEnd) and self.utterance_id is not None:
            utterance_id, self.utterance_id = self.utterance_id, None
            await self.channel.send(
                SpeechStopped(utterance_id=utterance_id, audio_end_ms=event.end_ms)
            )

    async def _update(self, message: SessionUpdate) -> None:
        """New settings: rates change the resamplers (the model's state is kept), turn
        detection the VAD; the rest is kept for the session (the model uses none of it)."""
        patch = message.session.model_dump(exclude_none=True)
        config = self.config.patched(patch)
        ready = self.link.ready
        if config.input_sample_rate != self.config.input_sample_rate:
            self.listener.set_input_rate(config.input_sample_rate)
            self._to_model = PolyphaseResampler(config.input_sample_rate, ready.input_sample_rate)
        if config.output_sample_rate != self.config.output_sample_rate:
            self._to_client = PolyphaseResampler(
                ready.output_sample_rate, config.output_sample_rate
            )
        if "turn_detection" in patch:
            self.listener.set_turns(*turn_settings(self.listener.settings, config.turn_detection))
        self.config = config
        await self.channel.send(SessionUpdated(session=config))
        await self._save()

    # ------------------------------------------------------------------ model → client

    async def _from_model(self) -> None:
        while True:
            said = await self.link.receive()
            if isinstance(said, TextDelta):
                self._said.append(said.delta)
                self._all_said.append(said.delta)
                await self.channel.send(
                    ResponseTextDelta(response_id=self.response_id, delta=said.delta)
                )
                continue
            self._agent_samples += len(said) // 2
            rate = self.config.output_sample_rate
            if rate == self.link.ready.output_sample_rate:
                await self.channel.send_audio(said)
            else:
                resampled = self._to_client.process(pcm16_to_float(said))
                if resampled.size:
                    await self.channel.send_audio(float_to_pcm16(resampled))
            metrics.DUPLEX_AUDIO.labels("out").inc(
                len(said) / (2 * self.link.ready.output_sample_rate)
            )

    async def _end_response(self, status: Status) -> None:
        """The one response ends with the session (sent only if the client is still there)."""
        metrics.RESPONSES.labels(status).inc()
        audio_ms = self._agent_samples * 1000 // self.link.ready.output_sample_rate
        text = "".join(self._all_said).strip()
        await self.channel.send(ResponseAudioDone(response_id=self.response_id, audio_ms=audio_ms))
        await self.channel.send(
            ResponseDone(response_id=self.response_id, status=status, text=text)
        )

    # ------------------------------------------------------------------ history

    def _end_agent_turn(self) -> None:
        """What the agent said since the user last started speaking becomes its turn."""
        text = "".join(self._said).strip()
        self._said, self._saved = [], 0
        if text:
            self.history.append(Turn("agent", text))
            keep_recent(self.history, self.settings.history_max_turns)

    async def _save_now_and_then(self) -> None:
        """Save the session while it runs (a gateway that dies loses little), with the agent's
        turn so far; the final save is the gateway's when the session ends."""
        while True:
            await asyncio.sleep(self.settings.duplex_history_interval_s)
            if len(self._said) != self._saved:
                self._saved = len(self._said)
                await self._save()

    async def _save(self) -> None:
        if self.store is None:
            return
        history = list(self.history)
        text = "".join(self._said).strip()
        if text:
            history.append(Turn("agent", text))
        keep_recent(history, self.settings.history_max_turns)
        if not await self.store.save(self.config, history, self.tenant):
            await self.take_over()  # its client resumed it on another gateway


async def open_duplex_session(
    config: SessionConfig,
    channel: SessionChannel,
    listener: Listener,
    settings: GatewaySection,
    store: SessionStore | None,
    tasks: asyncio.TaskGroup,
    headers: dict[str, str],
    *,
    tenant: str,
    meter: AudioMeter,
    history: list[Turn],
) -> DuplexSession:
    """A session whose duplex-service slot is held (before `session.created`): a full
    service is the client's 1013 with the service's retry hint."""
    try:
        link = await DuplexLink.open(
            settings.duplex_url,
            headers,
            settings.duplex_open_timeout_s,
            settings.server.ws_max_frame_bytes,
        )
    except CapacityError:
        metrics.SESSIONS_REFUSED.labels("duplex_capacity").inc()
        raise
    return DuplexSession(
        config,
        channel,
        listener,
        link,
        settings,
        store,
        tasks,
        tenant=tenant,
        meter=meter,
        history=history,
    )
