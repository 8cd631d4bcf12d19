"""Hearing: a session's microphone turned into utterances and transcripts.

`Hearing` owns what happens between the client's audio and the user's words: the VAD's
turn events, barge-in over the agent's audio, partial transcripts, the transcription
started at each pause (the speculation), the pause policy's asks, and the ASR job of each
finished utterance with its timeout. It reports to its session through `HearingHooks`
and never sends anything to the client itself.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from services.common.audio.listener import Listener
from services.common.audio.pcm import AudioF32, float_to_pcm16
from services.common.audio.turns import SpeechEnd, SpeechPause, SpeechStart, TurnEvent
from services.common.audio.vad import VadSettings
from services.common.bus.messages import AsrJob, AsrResult, JobFailed
from services.common.errors import AsrUnavailable, VoiceAgentError
from services.common.protocol.events import SessionConfig, TurnDetection
from services.gateway import metrics
from services.gateway.bus import GatewayBus
from services.gateway.pause import PauseWatch, Speculation
from services.gateway.settings import GatewaySection
from services.gateway.store import Unheard
from services.gateway.turn_end import EndOfTurn, Heard

Spawn = Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]]


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


_CLIENT_CODES = frozenset({"invalid_message", "invalid_audio", "unsupported_sample_rate"})


def job_error(result: JobFailed, fallback: type[VoiceAgentError]) -> VoiceAgentError:
    """A failed job as the client's error: the worker's code when it names the client's mistake."""
    error = fallback(result.message)
    if result.code in _CLIENT_CODES:
        error.code = result.code
    return error


@dataclass(frozen=True, slots=True)
class Utterance:
    """A finished utterance of the user: where it lies in the stream and when it ended."""

    id: str
    start_ms: int
    end_ms: int
    speech_end_at: float | None
    """Clock time of the end of the speech (voice-to-voice is timed from here); None for
    one heard again on a resume (it ended on another connection)."""


class HearingHooks(Protocol):
    """What a session does with what its hearing reports."""

    def speaking(self) -> bool:
        """Whether agent audio is playing at the client now (speech over it may barge in)."""
        ...

    async def speech_started(self, utterance_id: str, start_ms: int) -> None: ...

    async def speech_stopped(self, utterance_id: str, end_ms: int) -> None: ...

    async def barged_in(self) -> None:
        """The user spoke over the agent long enough: stop its reply."""

    async def partial(self, utterance_id: str, text: str) -> None: ...

    async def pause_heard(self, utterance_id: str, heard: Heard) -> None:
        """The transcript of a pause inside the open utterance (the user may go on)."""

    async def speech_resumed(self, utterance_id: str) -> None:
        """The user spoke again after a pause: the utterance goes on."""

    async def transcript(
        self, utterance: Utterance, text: str, language: str | None = None
    ) -> None:
        """The final transcript of a finished utterance (its text may be empty), in the
        language the ASR heard (None: it does not say)."""

    async def asr_failed(self, error: VoiceAgentError) -> None:
        """No transcript will come for the utterance that ended last (failed or timed out)."""

    async def note_unheard(self, unheard: Unheard | None) -> None:
        """Where the utterance just sent for transcription lies (None: the user went on)."""


@dataclass
class _Pending:
    """A finished utterance waiting for its final transcript."""

    utterance: Utterance
    job_id: str
    """The ASR job whose result is its final (its own, or the pause's speculation's)."""
    timeout: asyncio.TimerHandle


class Hearing:
    """VAD events, barge-in, partials, speculation, the pause policy and ASR jobs."""

    def __init__(
        self,
        config: SessionConfig,
        listener: Listener,
        bus: GatewayBus,
        settings: GatewaySection,
        end_of_turn: EndOfTurn,
        hooks: HearingHooks,
        *,
        tenant: str,
        spawn: Spawn,
        clock: Callable[[], float],
    ) -> None:
        self.config = config
        self.listener = listener
        self.bus = bus
        self.settings = settings
        self.hooks = hooks
        self.tenant = tenant
        self.spawn = spawn
        self.clock = clock
        self.utterance_id: str | None = None
        """The utterance the VAD has open (None between utterances)."""
        self.pending: dict[str, _Pending] = {}
        self.speculation = Speculation()
        self.pause = PauseWatch(end_of_turn, listener.segmenter, settings, spawn, self._pause_ended)
        self._speech_started_at: float | None = None  # clock time of the last SpeechStart
        self._barge_in_from_ms: int | None = None  # speech start while agent audio plays
        self._partial: tuple[str, float] | None = None  # (utterance, asked at) in flight
        self._last_partial_ms = 0
        self._paused_at: int | None = None  # where the open utterance's last pause began
        self._notes = 0
        """Notes of where the last utterance sent lies, in the order they were asked for:
        one superseded before it is written (by the next, or by more speech) is not."""
        self._noting = asyncio.Lock()
        self._noted_for: str | None = None
        """The utterance the last note asked for names (None: withdrawn)."""
        if config.turn_detection is not None:  # a resumed session's own
            self.set_turn_detection(config.turn_detection)

    # ------------------------------------------------------------------ audio

    async def hear(self, pcm: bytes) -> None:
        """One audio frame: its VAD result (timed), turn events, barge-in and partials."""
        received_at = self.clock()
        events = await self.listener.push_batched(pcm)
        metrics.HEARING.record(self.clock() - received_at)
        for event in events:
            await self._on_turn_event(event)
        await self._check_resumed()
        await self._check_barge_in()
        await self._maybe_partial()
        self.pause.maybe_ask(self.utterance_id)

    def busy(self) -> bool:
        """An utterance is open, or a finished one waits for its transcript."""
        return self.utterance_id is not None or bool(self.pending)

    async def commit(self) -> None:
        """The client ends the utterance now (a manual turn)."""
        end = self.listener.commit()
        if end is not None:
            await self._end_of_turn(end)

    def clear(self) -> bool:
        """The client drops what it said since the last turn; whether an utterance was open."""
        self.listener.clear()
        cleared, self.utterance_id = self.utterance_id, None
        if cleared is not None and self._noted_for == cleared:
            self._note(None)  # taken back: not to be heard again
        return cleared is not None

    def set_input_rate(self, rate: int) -> None:
        self.listener.set_input_rate(rate)

    def set_turn_detection(self, turns: TurnDetection | None) -> None:
        self.listener.set_turns(*turn_settings(self.listener.settings, turns))

    async def _on_turn_event(self, event: TurnEvent) -> None:
        if isinstance(event, SpeechPause):
            await self._on_pause(event)
        elif isinstance(event, SpeechStart):
            self.utterance_id = new_id("utt")
            self._last_partial_ms = event.start_ms
            lag_s = (self.listener.segmenter.position_ms - event.start_ms) / 1000
            self._speech_started_at = self.clock() - max(0.0, lag_s)
            if self.hooks.speaking():
                self._barge_in_from_ms = event.start_ms
            await self.hooks.speech_started(self.utterance_id, event.start_ms)
        else:
            if self._barge_in_from_ms is not None and self.hooks.speaking():
                metrics.FALSE_INTERRUPTIONS.inc()  # it ended before it could interrupt
            self._barge_in_from_ms = None
            await self._end_of_turn(event)

    async def _check_resumed(self) -> None:
        """Whether speech came back after the pause last reported, in the same utterance."""
        paused_at = self._paused_at
        if paused_at is None or self.listener.segmenter.silence_start_ms == paused_at:
            return
        self._paused_at = None
        if self.utterance_id is not None:
            if self._noted_for == self.utterance_id:
                self._note(None)  # the pause's words are not the turn: not to be heard again
            await self.hooks.speech_resumed(self.utterance_id)

    async def _check_barge_in(self) -> None:
        """Stop the agent once the user has spoken over it long enough: speech that began
        over the agent's audio, or the agent's audio that began over speech (a reply that
        starts while the user is already talking)."""
        segmenter = self.listener.segmenter
        if self._barge_in_from_ms is None:
            overlapping = segmenter.in_speech and segmenter.trailing_silence_ms == 0
            if overlapping and self.utterance_id is not None and self.hooks.speaking():
                self._barge_in_from_ms = segmenter.position_ms
                self._speech_started_at = self.clock()  # time to silence from the overlap
            return
        if not self.hooks.speaking():
            self._barge_in_from_ms = None
            return
        # speech so far: a cough followed by silence never reaches the threshold
        spoken_ms = segmenter.position_ms - self._barge_in_from_ms - segmenter.trailing_silence_ms
        if spoken_ms >= self.settings.barge_in_min_ms:
            self._barge_in_from_ms = None
            metrics.INTERRUPTIONS.inc()
            await self.hooks.barged_in()
            if self._speech_started_at is not None:
                metrics.BARGE_IN_SILENCE.observe(self.clock() - self._speech_started_at)

    async def _maybe_partial(self) -> None:
        """Ask for a partial transcript now and then; at most one in flight, droppable."""
        interval = self.settings.partial_interval_ms
        utterance_id = self.utterance_id
        segmenter = self.listener.segmenter
        if not self.config.partials or utterance_id is None:
            return
        if not self.listener.partial_due(self._last_partial_ms, interval):
            return
        if segmenter.trailing_silence_ms > 0:
            return  # nothing new to hear; the ASR is kept free for the pause's final
        if self._partial is not None and self.clock() - self._partial[1] < 2 * interval / 1000:
            return  # one in flight (a lost one expires)
        self._last_partial_ms = segmenter.position_ms
        self._partial = (utterance_id, self.clock())
        metrics.PARTIALS.labels("asked").inc()
        job = self._asr_job(utterance_id, new_id("asrp"), "partial")
        await self.bus.submit_asr(job, float_to_pcm16(segmenter.current_audio()))

    async def _on_pause(self, pause: SpeechPause) -> None:
        """A pause inside the open utterance: transcribe it speculatively, and ask the pause
        policy whether the turn is over."""
        utterance_id = self.utterance_id
        if utterance_id is None:
            return
        self._paused_at = pause.end_ms
        if self.settings.speculative_asr:
            job = self._asr_job(utterance_id, new_id("asrs"), "final")
            self.speculation.start(utterance_id, pause.end_ms, job.job_id)
            self._submit(job, pause.audio, pause.start_ms, pause.end_ms)
        self.pause.watch(utterance_id, pause.end_ms, self.speculation.text)

    async def _pause_ended(self, utterance_id: str) -> None:
        """The pause policy ended the turn: the same end and audio as the VAD's SpeechEnd."""
        if self.utterance_id != utterance_id:
            return
        end = self.listener.commit()
        if end is not None:
            await self._end_of_turn(end)

    def _asr_job(self, utterance_id: str, job_id: str, mode: str) -> AsrJob:
        return AsrJob(
            job_id=job_id,
            tenant=self.tenant,
            session_id=self.config.id,
            utterance_id=utterance_id,
            reply_to=self.bus.reply_to,
            mode="partial" if mode == "partial" else "final",
            source_rate=self.listener.input_rate,
            language=self.config.language,
            enqueued_at=time.time(),
        )

    # ------------------------------------------------------------------ end of turn

    async def _end_of_turn(self, end: SpeechEnd) -> None:
        utterance_id = self.utterance_id or new_id("utt")
        self.utterance_id = None
        self._paused_at = None
        self.pause.stop()
        lag_s = max(0.0, (self.listener.segmenter.position_ms - end.end_ms) / 1000)
        metrics.END_OF_TURN_DELAY.observe(lag_s)
        reused = self.speculation.take(utterance_id, end)
        utterance = Utterance(utterance_id, end.start_ms, end.end_ms, self.clock() - lag_s)
        job_id = reused.job_id if reused is not None else new_id("asr")
        timeout = asyncio.get_running_loop().call_later(
            self.settings.asr_timeout_s, self._asr_timed_out, utterance_id
        )
        self.pending[utterance_id] = _Pending(utterance, job_id, timeout)
        await self.hooks.speech_stopped(utterance_id, end.end_ms)
        if reused is not None:
            if reused.result is not None:  # the transcript is already here
                await self._on_final(reused.result)
            return
        job = self._asr_job(utterance_id, job_id, "final")
        self._submit(job, end.audio, end.start_ms, end.end_ms)

    def _submit(self, job: AsrJob, audio: AudioF32, start_ms: int, end_ms: int) -> None:
        """A final-mode job goes off the input path: while Redis is out of reach the bus
        tries it again for up to the session's timeout, and the client's frames (a close
        among them) must not wait for that. Once it is in, where it lies is noted: should
        this connection end before its words are taken, the next one hears it again."""
        self._notes += 1
        note = self._notes
        self._noted_for = job.utterance_id

        async def submit() -> None:
            where = await self.bus.submit_asr(job, float_to_pcm16(audio))
            if where is not None:
                stream, entry_id = where
                utterance = job.utterance_id
                unheard = Unheard(
                    utterance_id=utterance,
                    stream=stream,
                    entry_id=entry_id.decode(),
                    start_ms=start_ms,
                    end_ms=end_ms,
                )
                await self._noted(note, unheard)

        self.spawn(submit(), "asr-submit")

    def words_taken(self, utterance_id: str) -> None:
        """The session's record holds this utterance's words now: its note goes (the
        record's `taken` guards a resume already; a record written without it, by a gateway
        of an older version, would not)."""
        if self._noted_for == utterance_id:
            self._note(None)

    def _note(self, unheard: Unheard | None) -> None:
        self._notes += 1
        self._noted_for = None if unheard is None else unheard.utterance_id
        self.spawn(self._noted(self._notes, unheard), "asr-note")

    async def _noted(self, note: int, unheard: Unheard | None) -> None:
        """Write a note unless a later one was asked for meanwhile (notes land in order)."""
        async with self._noting:
            if note == self._notes:
                await self.hooks.note_unheard(unheard)

    async def hear_again(self, unheard: Unheard) -> bool:
        """A resumed session's utterance whose words its last connection never took: its
        audio is read back from its job's entry and transcribed again, as a finished
        utterance (its transcript comes as any other's). False when it cannot be read."""
        found = await self.bus.job_audio(unheard.stream, unheard.entry_id)
        if found is None:
            return False
        old, pcm16 = found
        theirs = (old.session_id, old.utterance_id, old.tenant)
        if theirs != (self.config.id, unheard.utterance_id, self.tenant):
            return False  # not this session's words (a note gone wrong): never heard here
        job = old.model_copy(
            update={
                "job_id": new_id("asr"),
                "reply_to": self.bus.reply_to,
                "enqueued_at": time.time(),
            }
        )
        utterance = Utterance(unheard.utterance_id, unheard.start_ms, unheard.end_ms, None)
        timeout = asyncio.get_running_loop().call_later(
            self.settings.asr_timeout_s, self._asr_timed_out, utterance.id
        )
        self.pending[utterance.id] = _Pending(utterance, job.job_id, timeout)
        self.spawn(self._resubmit(job, pcm16), "asr-submit")
        return True

    async def _resubmit(self, job: AsrJob, pcm16: bytes) -> None:
        await self.bus.submit_asr(job, pcm16)

    def _asr_timed_out(self, utterance_id: str) -> None:
        if self.pending.pop(utterance_id, None) is not None:
            error = AsrUnavailable(f"no transcript for {utterance_id} in time")
            self.spawn(self.hooks.asr_failed(error), "asr-timeout")

    # ------------------------------------------------------------------ ASR results

    async def on_result(self, result: AsrResult) -> None:
        if result.mode == "final" and self.speculation.is_current(result.job_id):
            heard = self.speculation.arrived(result)
            if heard is not None and self._paused_at is not None:  # the pause still lasts
                await self.hooks.pause_heard(result.utterance_id, heard)
        elif result.mode == "final":
            await self._on_final(result)
        else:
            if self._partial is not None and self._partial[0] == result.utterance_id:
                self._partial = None
            if result.utterance_id == self.utterance_id and result.text:
                metrics.PARTIALS.labels("sent").inc()
                await self.hooks.partial(result.utterance_id, result.text)

    async def _on_final(self, result: AsrResult) -> None:
        pending = self.pending.get(result.utterance_id)
        if pending is None or pending.job_id != result.job_id:
            metrics.STALE_DROPPED.labels("asr_result").inc()
            return  # a repeat, a dropped speculation, or timed out: one final per utterance
        del self.pending[result.utterance_id]
        pending.timeout.cancel()
        if pending.utterance.speech_end_at is not None:
            metrics.ASR_ROUNDTRIP.observe(self.clock() - pending.utterance.speech_end_at)
        await self.hooks.transcript(pending.utterance, result.text, result.language)

    async def on_failed(self, result: JobFailed) -> None:
        if self.speculation.is_current(result.job_id):
            self.speculation.drop("failed")  # the turn's end sends the audio again
            return
        pending = self.pending.get(result.utterance_id or "")
        if pending is None or pending.job_id != result.job_id:
            metrics.STALE_DROPPED.labels("asr_failure").inc()
            return  # a partial's, a dropped speculation's, or a repeat
        del self.pending[pending.utterance.id]
        pending.timeout.cancel()
        await self.hooks.asr_failed(job_error(result, AsrUnavailable))

    def stop(self) -> None:
        """The session ends: no timer of hearing's may fire after it."""
        for pending in self.pending.values():
            pending.timeout.cancel()
        self.pause.stop()
        self.speculation.drop(None)


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
