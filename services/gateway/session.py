"""The session state machine: turns in, transcripts, agent responses and paced audio out.

Inputs: client audio and events (`serve`), and bus results (`deliver`, via an inbox
so one slow client never stalls the gateway's result reader). Every task the
session starts lives in the connection's task group and is cancelled with it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from services.common.audio.listener import Listener
from services.common.audio.pcm import AudioF32, float_to_pcm16, ms_to_samples
from services.common.audio.turns import SpeechEnd, SpeechPause, SpeechStart, TurnEvent
from services.common.audio.vad import VadSettings
from services.common.auth.limits import NO_METER
from services.common.bus.messages import (
    AsrJob,
    AsrResult,
    BusResult,
    JobFailed,
    TtsChunk,
    TtsDone,
    TtsJob,
)
from services.common.errors import (
    AgentFailed,
    AsrUnavailable,
    InvalidMessage,
    TtsUnavailable,
    VoiceAgentError,
)
from services.common.protocol.events import (
    CLIENT_EVENTS,
    ConversationText,
    InputAudioClear,
    InputAudioCommit,
    OutputAudioClear,
    ResponseAudioDone,
    ResponseCancel,
    ResponseCreate,
    ResponseCreated,
    ResponseDone,
    ResponseTextDelta,
    SessionClose,
    SessionConfig,
    SessionUpdate,
    SessionUpdated,
    SpeechStarted,
    SpeechStopped,
    TranscriptFinal,
    TranscriptPartial,
    TurnDetection,
    parse,
)
from services.common.service.ws import Channel
from services.common.tenancy import DEFAULT_TENANT
from services.gateway import metrics
from services.gateway.agent import AGENTS, Agent, Turn
from services.gateway.bus import GatewayBus
from services.gateway.chunking import Chunker
from services.gateway.response import ResponseAudio
from services.gateway.settings import GatewaySection
from services.gateway.store import SessionStore
from services.gateway.turn_end import EndOfTurn, Heard, SilenceOnly

log = logging.getLogger(__name__)


class SessionClosed(Exception):
    """The client asked to close the session."""


_CLIENT_CODES = frozenset({"invalid_message", "invalid_audio", "unsupported_sample_rate"})


def _job_error(result: JobFailed, fallback: type[VoiceAgentError]) -> VoiceAgentError:
    """A failed job as the client's error: the worker's code when it names the client's mistake."""
    error = fallback(result.message)
    if result.code in _CLIENT_CODES:
        error.code = result.code
    return error


def _settle(future: asyncio.Future[Heard | None], value: Heard | None) -> None:
    if not future.done():
        future.set_result(value)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


@dataclass
class _Utterance:
    start_ms: int
    end_ms: int
    speech_end_at: float
    job_id: str
    """The ASR job whose result is this utterance's final (its own, or the speculation's)."""
    timeout: asyncio.TimerHandle | None = None


@dataclass
class _Speculation:
    """A transcription started at a pause of the open utterance."""

    utterance_id: str
    end_ms: int
    job_id: str
    heard: asyncio.Future[Heard | None]
    """Its text once it comes; None if it is dropped or fails first."""
    result: AsrResult | None = None
    """Its transcript, when it came before the turn ended."""
    before: str | None = None
    """The transcript at the utterance's previous pause, when it came in time."""


@dataclass
class _Pause:
    """The pause a pause policy (smart-turn) is deciding about."""

    utterance_id: str
    end_ms: int
    asks: int = 0
    asking: bool = False


@dataclass
class _Held:
    """A user turn the end-of-turn policy is holding on: the user may go on."""

    utterance_id: str
    speech_end_at: float
    timer: asyncio.TimerHandle | None  # None once the user spoke again


@dataclass
class _Response:
    id: str
    utterance_id: str | None
    audio: ResponseAudio
    speech_end_at: float | None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    play_started: float | None = None
    sent_bytes: int = 0
    done: bool = False
    agent_failed: bool = False
    first_tts_at: float | None = None


class Session:
    """One conversation on one WebSocket."""

    def __init__(
        self,
        config: SessionConfig,
        channel: Channel,
        bus: GatewayBus,
        listener: Listener,
        settings: GatewaySection,
        tasks: asyncio.TaskGroup,
        agents: dict[str, Callable[[], Agent]] = AGENTS,
        store: SessionStore | None = None,
        clock: Callable[[], float] = time.monotonic,
        end_of_turn: EndOfTurn | None = None,
    ) -> None:
        self.config = config
        self.channel = channel
        self.bus = bus
        self.listener = listener
        self.settings = settings
        self.tasks = tasks
        self.agents = agents
        self.store = store
        self.clock = clock
        self.end_of_turn = end_of_turn or SilenceOnly(settings)
        self.history: list[Turn] = []
        self.tenant = DEFAULT_TENANT
        """Whose session it is: its jobs carry it, its audio counts against its quota."""
        self.meter = NO_METER
        self.inbox: asyncio.Queue[tuple[BusResult, bytes | None, float]] = asyncio.Queue(
            settings.inbox_size
        )
        self.utterances: dict[str, _Utterance] = {}
        self.utterance_id: str | None = None
        self.response: _Response | None = None
        self._speech_started_at: float | None = None  # clock time of the last SpeechStart
        self._barge_in_from_ms: int | None = None  # speech start while agent audio plays
        self._partial: tuple[str, float] | None = None  # (utterance, asked at) in flight
        self._last_partial_ms = 0
        self._held: _Held | None = None
        self._speculation: _Speculation | None = None
        self._pause: _Pause | None = None
        self._children: set[asyncio.Task[None]] = set()
        if config.turn_detection is not None:  # a resumed session's own
            listener.set_turns(*turn_settings(listener.settings, config.turn_detection))

    # ------------------------------------------------------------------ inputs

    async def serve(self) -> None:
        """Read client frames until the client leaves or closes the session."""
        self._spawn(self._process_inbox(), "inbox")
        try:
            while True:
                frame = await self.channel.receive()
                try:
                    if frame.data is not None:
                        await self._hear(frame.data)
                    else:
                        await self._on_message(frame.text or "")
                except SessionClosed:
                    await self.channel.close(1000, "session closed")
                    return
                except VoiceAgentError as exc:
                    if exc.fatal:
                        raise
                    await self.channel.send_error(exc)
        finally:
            await self._stop()

    async def _hear(self, pcm: bytes) -> None:
        """One audio frame: its VAD result (timed), turn events, barge-in and partials."""
        received_at = self.clock()
        await self.meter.add_pcm16(len(pcm), self.config.input_sample_rate)
        events = await self.listener.push_batched(pcm)
        metrics.HEARING.record(self.clock() - received_at)
        await self._on_turn_events(events)
        await self._check_barge_in()
        await self._maybe_partial()
        self._maybe_ask_again()

    def deliver(self, result: BusResult, audio: bytes | None) -> None:
        """A bus result for this session (called by the gateway's result reader)."""
        try:
            self.inbox.put_nowait((result, audio, self.clock()))
        except asyncio.QueueFull:
            log.error("session %s inbox full: result dropped", self.config.id)

    async def _on_message(self, text: str) -> None:
        message = parse(CLIENT_EVENTS, text)
        match message:
            case SessionUpdate():
                await self._update(message)
            case InputAudioCommit():
                end = self.listener.commit()
                if end is not None:
                    await self._end_of_turn(end)
            case InputAudioClear():
                self.listener.clear()
                self.utterance_id = None
            case ConversationText():
                await self._user_turn(message.text)
                await self._start_response(None, None)
            case ResponseCreate():
                await self._start_response(None, None, fixed_text=message.text)
            case ResponseCancel():
                await self._cancel_response()
            case SessionClose():
                raise SessionClosed

    async def _update(self, message: SessionUpdate) -> None:
        patch = message.session.model_dump(exclude_none=True)
        if "agent" in patch and patch["agent"] not in self.agents:
            known = ", ".join(sorted(self.agents))
            raise InvalidMessage(f"unknown agent {patch['agent']!r}; choose one of {known}")
        if "input_sample_rate" in patch:
            self.listener.set_input_rate(patch["input_sample_rate"])
        self.config = SessionConfig.model_validate({**self.config.model_dump(), **patch})
        if "turn_detection" in patch:
            self.listener.set_turns(
                *turn_settings(self.listener.settings, self.config.turn_detection)
            )
        await self.channel.send(SessionUpdated(session=self.config))
        await self._save()

    # ------------------------------------------------------------------ turns

    async def _on_turn_events(self, events: list[TurnEvent]) -> None:
        for event in events:
            if isinstance(event, SpeechPause):
                await self._on_pause(event)
            elif isinstance(event, SpeechStart):
                self.utterance_id = new_id("utt")
                self._last_partial_ms = event.start_ms
                lag_s = (self.listener.segmenter.position_ms - event.start_ms) / 1000
                self._speech_started_at = self.clock() - max(0.0, lag_s)
                await self.channel.send(
                    SpeechStarted(utterance_id=self.utterance_id, audio_start_ms=event.start_ms)
                )
                if self._held is not None and self._held.timer is not None:
                    self._held.timer.cancel()  # the user goes on: wait for the rest
                    self._held.timer = None
                if self.response is not None and self.response.sent_bytes > 0:
                    self._barge_in_from_ms = event.start_ms
            else:
                if self._barge_in_from_ms is not None and self.response is not None:
                    metrics.FALSE_INTERRUPTIONS.inc()  # it ended before it could interrupt
                self._barge_in_from_ms = None
                await self._end_of_turn(event)

    async def _check_barge_in(self) -> None:
        """Cancel the playing response once the user has spoken over it long enough."""
        if self._barge_in_from_ms is None:
            return
        if self.response is None:
            self._barge_in_from_ms = None
            return
        segmenter = self.listener.segmenter
        # speech so far: a cough followed by silence never reaches the threshold
        spoken_ms = segmenter.position_ms - self._barge_in_from_ms - segmenter.trailing_silence_ms
        if spoken_ms >= self.settings.barge_in_min_ms:
            self._barge_in_from_ms = None
            metrics.INTERRUPTIONS.inc()
            await self._cancel_response()
            if self._speech_started_at is not None:
                metrics.BARGE_IN_SILENCE.observe(self.clock() - self._speech_started_at)

    async def _maybe_partial(self) -> None:
        """Ask for a partial transcript now and then; at most one in flight, droppable."""
        interval = self.settings.partial_interval_ms
        utterance_id = self.utterance_id
        segmenter = self.listener.segmenter
        if utterance_id is None or not self.listener.partial_due(self._last_partial_ms, interval):
            return
        if segmenter.trailing_silence_ms > 0:
            return  # nothing new to hear; the ASR is kept free for the pause's final
        if self._partial is not None and self.clock() - self._partial[1] < 2 * interval / 1000:
            return  # one in flight (a lost one expires)
        self._last_partial_ms = segmenter.position_ms
        self._partial = (utterance_id, self.clock())
        job = AsrJob(
            job_id=new_id("asrp"),
            tenant=self.tenant,
            session_id=self.config.id,
            utterance_id=utterance_id,
            reply_to=self.bus.reply_to,
            mode="partial",
            language=self.config.language,
            enqueued_at=time.time(),
        )
        metrics.PARTIALS.labels("asked").inc()
        await self.bus.submit_asr(job, float_to_pcm16(segmenter.current_audio()))

    async def _on_pause(self, pause: SpeechPause) -> None:
        """A pause inside the open utterance: transcribe it speculatively, and ask a pause
        policy whether the turn is over."""
        utterance_id = self.utterance_id
        if utterance_id is None:
            return
        if self.settings.speculative_asr:
            earlier = self._speculation
            self._drop_speculation("wasted")  # the user went on after an earlier pause
            job = self._asr_job(utterance_id, new_id("asrs"))
            heard = asyncio.get_running_loop().create_future()
            self._speculation = _Speculation(utterance_id, pause.end_ms, job.job_id, heard)
            if earlier and earlier.utterance_id == utterance_id and earlier.result is not None:
                self._speculation.before = earlier.result.text
            await self.bus.submit_asr(job, float_to_pcm16(pause.audio))
        if self.end_of_turn.decides_at_pause:
            self._pause = _Pause(utterance_id, pause.end_ms)
            self._maybe_ask_again()

    def _speculative_text(self) -> asyncio.Future[Heard | None]:
        """The transcript of the speculation under way, a future (already None: none)."""
        if self._speculation is not None:
            return self._speculation.heard
        none: asyncio.Future[Heard | None] = asyncio.get_running_loop().create_future()
        none.set_result(None)
        return none

    def _silence_ms(self) -> int:
        return self.listener.segmenter.trailing_silence_ms

    def _in_pause(self, pause: _Pause) -> bool:
        """Whether the user is still silent in the pause the policy was asked about."""
        segmenter = self.listener.segmenter
        return (
            self._pause is pause
            and self.utterance_id == pause.utterance_id
            and segmenter.silence_start_ms == pause.end_ms
        )

    async def _ask_turn_model(self, pause: _Pause, audio: AudioF32, silence_ms: int) -> None:
        complete = await self.end_of_turn.turn_complete(audio, self._speculative_text(), silence_ms)
        pause.asking = False
        if not complete or not self._in_pause(pause):
            return
        self._pause = None
        end = self.listener.commit()  # the same end and audio as the VAD's SpeechEnd
        if end is not None:
            await self._end_of_turn(end)

    def _maybe_ask_again(self) -> None:
        """While the pause goes on, ask the pause policy again every recheck interval."""
        pause = self._pause
        if pause is None or pause.asking:
            return
        if not self._in_pause(pause):
            self._pause = None
            return
        silence = self._silence_ms()
        # on a fixed grid of silence (first ask, then every recheck): no drift from the
        # VAD's 32 ms windows or from a slow answer
        due = (
            self.settings.end_of_turn_first_ask_ms
            + pause.asks * self.settings.end_of_turn_recheck_ms
        )
        if silence >= due:
            pause.asking = True
            pause.asks += 1
            audio = self.listener.segmenter.current_audio()
            self._spawn(self._ask_turn_model(pause, audio, silence), "turn-model")

    def _drop_speculation(self, outcome: str) -> None:
        if self._speculation is not None:
            _settle(self._speculation.heard, None)
            self._speculation = None
            metrics.SPECULATIVE_ASR.labels(outcome).inc()

    def _asr_job(self, utterance_id: str, job_id: str) -> AsrJob:
        return AsrJob(
            job_id=job_id,
            tenant=self.tenant,
            session_id=self.config.id,
            utterance_id=utterance_id,
            reply_to=self.bus.reply_to,
            sample_rate=16000,
            language=self.config.language,
            enqueued_at=time.time(),
        )

    async def _end_of_turn(self, end: SpeechEnd) -> None:
        utterance_id = self.utterance_id or new_id("utt")
        self.utterance_id = None
        self._pause = None
        lag_s = max(0.0, (self.listener.segmenter.position_ms - end.end_ms) / 1000)
        metrics.END_OF_TURN_DELAY.observe(lag_s)
        speculation, self._speculation = self._speculation, None
        if speculation is not None:
            _settle(speculation.heard, None)  # the turn is decided: nobody waits for it now
        reuse = (
            speculation
            if speculation is not None
            and speculation.utterance_id == utterance_id
            and speculation.end_ms == end.end_ms
            and not end.forced
            else None
        )
        job = self._asr_job(utterance_id, reuse.job_id if reuse else new_id("asr"))
        utterance = _Utterance(end.start_ms, end.end_ms, self.clock() - lag_s, job.job_id)
        await self.channel.send(SpeechStopped(utterance_id=utterance_id, audio_end_ms=end.end_ms))
        loop = asyncio.get_running_loop()
        utterance.timeout = loop.call_later(
            self.settings.asr_timeout_s, self._asr_timed_out, utterance_id
        )
        self.utterances[utterance_id] = utterance
        if reuse is not None:
            metrics.SPECULATIVE_ASR.labels("used").inc()
            if reuse.result is not None:  # the transcript is already here
                await self._on_transcript(reuse.result)
            return
        if speculation is not None:
            metrics.SPECULATIVE_ASR.labels("wasted").inc()
        await self.bus.submit_asr(job, float_to_pcm16(end.audio))

    def _asr_timed_out(self, utterance_id: str) -> None:
        if self.utterances.pop(utterance_id, None) is not None:
            error = AsrUnavailable(f"no transcript for {utterance_id} in time")
            self._spawn(self.channel.send_error(error), "asr-timeout")
            self._spawn(self._release_held(), "asr-timeout-release")

    async def _user_turn(self, text: str) -> None:
        self.history.append(Turn("user", text))
        await self._save()

    async def _save(self) -> None:
        if self.store is not None:
            await self.store.save(self.config, self.history)

    # ------------------------------------------------------------------ bus results

    async def _process_inbox(self) -> None:
        while True:
            result, audio, delivered_at = await self.inbox.get()
            await self._on_result(result, audio)
            metrics.RESULTS_WAIT.record(self.clock() - delivered_at)

    async def _on_result(self, result: BusResult, audio: bytes | None) -> None:
        match result:
            case AsrResult(mode="final") if self._is_speculation(result.job_id):
                assert self._speculation is not None
                speculation = self._speculation
                speculation.result = result  # kept until the turn ends, or dropped
                heard = Heard(
                    result.text,
                    last_word_logprob=result.last_word_logprob,
                    before=speculation.before,
                    avg_logprob=result.avg_logprob,
                )
                _settle(speculation.heard, heard)
            case AsrResult(mode="final"):
                await self._on_transcript(result)
            case AsrResult():
                if self._partial is not None and self._partial[0] == result.utterance_id:
                    self._partial = None
                if result.utterance_id == self.utterance_id and result.text:
                    metrics.PARTIALS.labels("sent").inc()
                    await self.channel.send(
                        TranscriptPartial(utterance_id=result.utterance_id, text=result.text)
                    )
            case TtsChunk():
                active = self._current(result.response_id)
                if (
                    active is None
                    or audio is None
                    or not active.audio.add_audio(result.seq, result.index, audio)
                ):
                    metrics.STALE_DROPPED.labels("tts_chunk").inc()
            case TtsDone():
                active = self._current(result.response_id)
                if active is not None and result.status == "completed":
                    active.audio.finish_chunk(result.seq, result.chunks)
            case JobFailed():
                await self._on_failed(result)

    def _is_speculation(self, job_id: str) -> bool:
        """Whether a result answers the speculation of the utterance still open."""
        return self._speculation is not None and self._speculation.job_id == job_id

    async def _on_transcript(self, result: AsrResult) -> None:
        utterance = self.utterances.get(result.utterance_id)
        if utterance is None or utterance.job_id != result.job_id:
            metrics.STALE_DROPPED.labels("asr_result").inc()
            return  # a repeat, a dropped speculation, or timed out: one final per utterance
        del self.utterances[result.utterance_id]
        if utterance.timeout is not None:
            utterance.timeout.cancel()
        metrics.ASR_ROUNDTRIP.observe(self.clock() - utterance.speech_end_at)
        await self.channel.send(
            TranscriptFinal(
                utterance_id=result.utterance_id,
                text=result.text,
                audio_start_ms=utterance.start_ms,
                audio_end_ms=utterance.end_ms,
            )
        )
        if result.text.strip():
            await self._user_said(result.text, result.utterance_id, utterance.speech_end_at)
        else:
            await self._release_held()  # the user made a sound but said nothing more

    async def _user_said(self, text: str, utterance_id: str, speech_end_at: float) -> None:
        """A transcript ends the user's turn, unless the end-of-turn policy holds on."""
        held = self._drop_held()
        if held is not None and held.timer is None and self.history:
            metrics.TURN_HOLDS.labels("continued").inc()
            last = self.history[-1]
            self.history[-1] = Turn("user", f"{last.text} {text}")  # one turn, two breaths
            await self._save()
        else:
            await self._user_turn(text)
        hold_ms = await self.end_of_turn.hold_ms(list(self.history), self.history[-1].text)
        if hold_ms <= 0:
            await self._start_response(utterance_id, speech_end_at)
            return
        timer = asyncio.get_running_loop().call_later(hold_ms / 1000, self._hold_expired)
        self._held = _Held(utterance_id, speech_end_at, timer)

    def _drop_held(self) -> _Held | None:
        """Forget the held turn, its timer stopped; returns it."""
        held, self._held = self._held, None
        if held is not None and held.timer is not None:
            held.timer.cancel()
        return held

    def _hold_expired(self) -> None:
        metrics.TURN_HOLDS.labels("expired").inc()
        self._spawn(self._release_held(), "hold-expired")

    async def _release_held(self) -> None:
        """Answer the held turn now (its hold ran out, or what followed had no words)."""
        held = self._drop_held()
        if held is not None:
            await self._start_response(held.utterance_id, held.speech_end_at)

    async def _on_failed(self, result: JobFailed) -> None:
        if self._is_speculation(result.job_id):
            self._drop_speculation("failed")  # the turn's end sends the audio again
            return
        if result.utterance_id is not None:
            utterance = self.utterances.get(result.utterance_id)
            if utterance is None or utterance.job_id != result.job_id:
                metrics.STALE_DROPPED.labels("asr_failure").inc()
                return  # a partial's, a dropped speculation's, or a repeat
            del self.utterances[result.utterance_id]
            if utterance.timeout is not None:
                utterance.timeout.cancel()
            await self.channel.send_error(_job_error(result, AsrUnavailable))
            await self._release_held()
        elif result.response_id is not None and result.seq is not None:
            active = self._current(result.response_id)
            if active is not None:
                active.audio.finish_chunk(result.seq, 0, failed=True)
                await self.channel.send_error(_job_error(result, TtsUnavailable))

    def _current(self, response_id: str) -> _Response | None:
        active = self.response
        return active if active is not None and active.id == response_id else None

    # ------------------------------------------------------------------ responses

    async def _start_response(
        self, utterance_id: str | None, speech_end_at: float | None, fixed_text: str | None = None
    ) -> None:
        await self._cancel_response()
        self._drop_held()  # a response now supersedes the held turn
        response_id = new_id("resp")
        active = _Response(response_id, utterance_id, ResponseAudio(response_id), speech_end_at)
        self.response = active
        await self.channel.send(ResponseCreated(response_id=response_id, utterance_id=utterance_id))
        active.tasks.append(self._spawn(self._produce(active, fixed_text), "produce"))
        active.tasks.append(self._spawn(self._play(active), "play"))

    async def _produce(self, active: _Response, fixed_text: str | None) -> None:
        """Agent text → deltas to the client → sentence chunks → TTS jobs."""
        chunker = Chunker(self.settings.first_chunk_words)
        try:
            if fixed_text is not None:
                await self._text(active, chunker, fixed_text)
            else:
                agent = self.agents[self.config.agent]()
                started: float | None = self.clock()
                async for delta in agent.respond(list(self.history), self.config.instructions):
                    if started is not None:
                        metrics.AGENT_FIRST_TOKEN.observe(self.clock() - started)
                        started = None
                    await self._text(active, chunker, delta)
        except VoiceAgentError as exc:
            active.agent_failed = True
            await self.channel.send_error(exc)
        except Exception as exc:
            active.agent_failed = True
            log.exception("agent %s failed", self.config.agent)
            await self.channel.send_error(AgentFailed(f"the agent failed: {exc}"))
        for chunk in chunker.flush():
            await self._submit_tts(active, chunk)
        active.audio.finish_text()

    async def _text(self, active: _Response, chunker: Chunker, delta: str) -> None:
        if not delta:
            return
        await self.channel.send(ResponseTextDelta(response_id=active.id, delta=delta))
        for chunk in chunker.feed(delta):
            await self._submit_tts(active, chunk)

    async def _submit_tts(self, active: _Response, text: str) -> None:
        if active.first_tts_at is None:
            active.first_tts_at = self.clock()
        seq = active.audio.add_text(text)
        style = self.config.tts
        job = TtsJob(
            job_id=new_id("tts"),
            tenant=self.tenant,
            session_id=self.config.id,
            response_id=active.id,
            seq=seq,
            text=text,
            voice=self.config.voice,
            sample_rate=self.config.output_sample_rate,
            reply_to=self.bus.reply_to,
            exaggeration=style.exaggeration if style else None,
            cfg_weight=style.cfg_weight if style else None,
            temperature=style.temperature if style else None,
            enqueued_at=time.time(),
        )
        await self.bus.submit_tts(job)

    async def _play(self, active: _Response) -> None:
        """Send the response's audio in order, paced at real time plus a lead."""
        rate = self.config.output_sample_rate
        frame_bytes = 2 * ms_to_samples(self.settings.output_frame_ms, rate)
        pending = b""
        while True:
            active.audio.changed.clear()
            pcm = active.audio.next_audio()
            if pcm is not None:
                pending += pcm
                while len(pending) >= frame_bytes:
                    await self._send_frame(active, pending[:frame_bytes], rate)
                    pending = pending[frame_bytes:]
                continue
            if active.audio.complete:
                break
            try:
                await asyncio.wait_for(active.audio.changed.wait(), self.settings.tts_timeout_s)
            except TimeoutError:
                await self.channel.send_error(TtsUnavailable("no TTS audio arrived in time"))
                await self._finish(active, "failed")
                return
        if pending:
            await self._send_frame(active, pending, rate)
        failed = active.audio.any_failed or active.agent_failed
        status = "failed" if active.sent_bytes == 0 and failed else "completed"
        await self._finish(active, status)

    async def _send_frame(self, active: _Response, frame: bytes, rate: int) -> None:
        now = self.clock()
        if active.play_started is None:
            active.play_started = now
            if active.first_tts_at is not None:
                metrics.TTS_FIRST_AUDIO.observe(now - active.first_tts_at)
            if active.speech_end_at is not None:
                metrics.VOICE_TO_VOICE.observe(now - active.speech_end_at)
        sent_s = active.sent_bytes / (2 * rate)
        due = active.play_started + sent_s - self.settings.output_lead_ms / 1000
        if due > now:
            await asyncio.sleep(due - now)
        await self.channel.send_audio(frame)
        active.sent_bytes += len(frame)

    async def _finish(self, active: _Response, status: str) -> None:
        if active.done:
            return
        active.done = True
        if self.response is active:
            self.response = None
        rate = self.config.output_sample_rate
        audio_ms = round(active.sent_bytes * 1000 / (2 * rate))
        text = active.audio.text
        await self.channel.send(ResponseAudioDone(response_id=active.id, audio_ms=audio_ms))
        await self.channel.send(
            ResponseDone(
                response_id=active.id,
                status="failed" if status == "failed" else "completed",
                text=text,
            )
        )
        metrics.RESPONSES.labels(status).inc()
        if text and status == "completed":
            self.history.append(Turn("agent", text))
            await self._save()

    async def _cancel_response(self) -> None:
        """Stop the current response end to end; the user keeps only what they heard."""
        active = self.response
        if active is None or active.done:
            return
        active.done = True
        self.response = None
        current = asyncio.current_task()
        for task in active.tasks:
            if task is not current:
                task.cancel()
        await self.bus.cancel(active.id)
        heard = active.audio.heard_text(self._heard_bytes(active))
        if active.sent_bytes:
            await self.channel.send(OutputAudioClear(response_id=active.id))
        await self.channel.send(ResponseDone(response_id=active.id, status="cancelled", text=heard))
        metrics.RESPONSES.labels("cancelled").inc()
        if heard:
            self.history.append(Turn("agent", heard))
            await self._save()

    def _heard_bytes(self, active: _Response) -> int:
        """Audio that played at the client: sent, minus what its buffer still held."""
        if active.play_started is None:
            return 0
        rate = self.config.output_sample_rate
        played = int((self.clock() - active.play_started) * rate) * 2
        return min(active.sent_bytes, played)

    # ------------------------------------------------------------------ tasks

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = self.tasks.create_task(coro, name=f"{self.config.id}-{name}")
        self._children.add(task)
        task.add_done_callback(self._children.discard)
        return task

    async def _stop(self) -> None:
        self._drop_held()
        for utterance in self.utterances.values():
            if utterance.timeout is not None:
                utterance.timeout.cancel()
        if self.response is not None and not self.response.done:
            await self.bus.cancel(self.response.id)
        for task in list(self._children):
            task.cancel()


def turn_settings(base: VadSettings, turns: TurnDetection | None) -> tuple[VadSettings, bool]:
    """The gateway's VAD settings with the session's overrides, and whether silence ends a
    turn (`server_vad`) or only a commit does (`manual`)."""
    turns = turns or TurnDetection()
    update: dict[str, object] = {}
    if turns.threshold is not None:
        update["threshold"] = turns.threshold
    if turns.silence_ms is not None:
        update["min_silence_ms"] = turns.silence_ms
    if turns.prefix_padding_ms is not None:
        update["speech_pad_ms"] = turns.prefix_padding_ms
    return base.model_copy(update=update), turns.type == "server_vad"
