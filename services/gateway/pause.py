"""What hearing does at a pause inside an utterance: the speculation and the policy's asks.

At each pause the session transcribes the utterance so far (the speculation): if the turn
ends at that same pause, that transcript is the final and the ASR round trip is already
done. A pause policy (smart-turn) is asked whether the turn is over, on a fixed grid of
silence, with the speculation's transcript as a future.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from services.common.audio.pcm import AudioF32
from services.common.audio.turns import SpeechEnd, TurnSegmenter
from services.common.bus.messages import AsrResult
from services.gateway import metrics
from services.gateway.settings import GatewaySection
from services.gateway.turn_end import EndOfTurn, Heard

Spawn = Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]]


def _settle(future: asyncio.Future[Heard | None], value: Heard | None) -> None:
    if not future.done():
        future.set_result(value)


@dataclass
class SpeculativeFinal:
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


class Speculation:
    """The speculative final of the open utterance (at most one at a time)."""

    def __init__(self) -> None:
        self.current: SpeculativeFinal | None = None

    def start(self, utterance_id: str, end_ms: int, job_id: str) -> None:
        """A new pause: the one before it was wasted (the user went on)."""
        earlier = self.current
        self.drop("wasted")
        heard: asyncio.Future[Heard | None] = asyncio.get_running_loop().create_future()
        self.current = SpeculativeFinal(utterance_id, end_ms, job_id, heard)
        if earlier and earlier.utterance_id == utterance_id and earlier.result is not None:
            self.current.before = earlier.result.text

    def text(self) -> asyncio.Future[Heard | None]:
        """The transcript of the speculation under way (a future; already None: none)."""
        if self.current is not None:
            return self.current.heard
        none: asyncio.Future[Heard | None] = asyncio.get_running_loop().create_future()
        none.set_result(None)
        return none

    def is_current(self, job_id: str) -> bool:
        return self.current is not None and self.current.job_id == job_id

    def arrived(self, result: AsrResult) -> Heard | None:
        """Its transcript came: kept until the turn ends (or the speculation is dropped)."""
        current = self.current
        if current is None or current.job_id != result.job_id:
            return None
        current.result = result
        heard = Heard(
            result.text,
            last_word_logprob=result.last_word_logprob,
            before=current.before,
            avg_logprob=result.avg_logprob,
            language=result.language,
        )
        _settle(current.heard, heard)
        return heard

    def drop(self, outcome: str | None) -> None:
        """Forget it (`outcome` counted: wasted, failed; None: not counted)."""
        current, self.current = self.current, None
        if current is not None:
            _settle(current.heard, None)
            if outcome is not None:
                metrics.SPECULATIVE_ASR.labels(outcome).inc()

    def take(self, utterance_id: str, end: SpeechEnd) -> SpeculativeFinal | None:
        """The turn ended: the speculation when it is this end's final, else None (wasted)."""
        current, self.current = self.current, None
        if current is None:
            return None
        _settle(current.heard, None)  # the turn is decided: nobody waits for it now
        if current.utterance_id == utterance_id and end.ends_pause(current.end_ms):
            metrics.SPECULATIVE_ASR.labels("used").inc()
            return current
        metrics.SPECULATIVE_ASR.labels("wasted").inc()
        return None


@dataclass
class _Pause:
    """The pause the pause policy is deciding about."""

    utterance_id: str
    end_ms: int
    transcript: Callable[[], asyncio.Future[Heard | None]]
    asks: int = 0
    asking: bool = False


class PauseWatch:
    """Asks a pause policy, while the pause lasts, whether the turn is over."""

    def __init__(
        self,
        policy: EndOfTurn,
        segmenter: TurnSegmenter,
        settings: GatewaySection,
        spawn: Spawn,
        ended: Callable[[str], Awaitable[None]],
    ) -> None:
        self.policy = policy
        self.segmenter = segmenter
        self.settings = settings
        self.spawn = spawn
        self.ended = ended
        """Called with the utterance id when the policy ends its turn at the pause."""
        self._pause: _Pause | None = None

    def watch(
        self, utterance_id: str, end_ms: int, transcript: Callable[[], asyncio.Future[Heard | None]]
    ) -> None:
        if self.policy.decides_at_pause:
            self._pause = _Pause(utterance_id, end_ms, transcript)
            self.maybe_ask(utterance_id)

    def stop(self) -> None:
        self._pause = None

    def _in_pause(self, pause: _Pause, utterance_id: str | None) -> bool:
        """Whether the user is still silent in the pause the policy was asked about."""
        return (
            self._pause is pause
            and utterance_id == pause.utterance_id
            and self.segmenter.silence_start_ms == pause.end_ms
        )

    def maybe_ask(self, utterance_id: str | None) -> None:
        """While the pause goes on, ask again every recheck interval (`utterance_id`: the
        utterance open now)."""
        pause = self._pause
        if pause is None or pause.asking:
            return
        if not self._in_pause(pause, utterance_id):
            self._pause = None
            return
        silence = self.segmenter.trailing_silence_ms
        # on a fixed grid of silence (first ask, then every recheck): no drift from the
        # VAD's 32 ms windows or from a slow answer
        due = (
            self.settings.end_of_turn_first_ask_ms
            + pause.asks * self.settings.end_of_turn_recheck_ms
        )
        if silence >= due:
            pause.asking = True
            pause.asks += 1
            audio = self.segmenter.current_audio()
            self.spawn(self._ask(pause, audio, silence), "turn-model")

    async def _ask(self, pause: _Pause, audio: AudioF32, silence_ms: int) -> None:
        complete = await self.policy.turn_complete(audio, pause.transcript(), silence_ms)
        if complete and self._in_pause(pause, pause.utterance_id):
            # a turn called complete early ends at the least silence (on the clock, so a
            # stream that stops inside it is answered too); still `asking` meanwhile
            short_ms = self.settings.end_of_turn_min_silence_ms - self.segmenter.trailing_silence_ms
            if short_ms > 0:
                await asyncio.sleep(short_ms / 1000)
        pause.asking = False
        if not complete or not self._in_pause(pause, pause.utterance_id):
            return
        self._pause = None
        await self.ended(pause.utterance_id)
