"""One `/v1/stream` conversation as the client saw it, checked against the wire contract.

`Conversation.feed` takes every server message with its arrival time (StreamClient's
`on_message`), keeps what the load generator measures (utterances, responses, audio
arrival) and records each break of docs/protocol.md as a violation: a second
`transcript.final` for an utterance, agent audio after `output_audio.clear` or
`response.done`, a response without `response.done`, a barge-in the server ignored,
an unexpected close. Pure bookkeeping: no I/O, no clock of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

BARGE_IN_SPEECH_MS: Final = 800
"""User speech over agent audio at least this long must interrupt it (the gateway's
`barge_in_min_ms` is 300 by default: this leaves room for VAD and scheduling)."""
BARGE_IN_REMAINING_MS: Final = 1000
"""A response that went on this long after the user spoke over it ignored the barge-in."""
AUDIO_MS_TOLERANCE: Final = 2.0
"""`response.audio.done`'s `audio_ms` may differ from the audio received by rounding."""
LEGIT_CLOSE_CODES: Final = frozenset({1012, 1013})
"""Closes the protocol announces (restarting, at capacity): errors, not violations."""
MAX_VIOLATIONS: Final = 20
"""Per conversation: past this a broken server would only repeat itself."""
ASR_FAILURES: Final = frozenset({"asr_unavailable", "internal"})
"""Error codes that stand in for an utterance's missing transcript.final."""
OUTPUT_RATE: Final = 24000
"""The agent audio's rate until the session says otherwise."""


@dataclass
class Utterance:
    """One user utterance the server heard (`speech.started` … `transcript.final`)."""

    id: str
    started_at: float | None = None
    stopped_at: float | None = None
    audio_start_ms: int | None = None
    audio_end_ms: int | None = None
    finals: list[tuple[float, str]] = field(default_factory=list)
    over_response: str | None = None  # agent audio playing when it started
    over_audio_ms: float = 0.0  # how much of that response's audio had arrived then

    @property
    def final_at(self) -> float | None:
        return self.finals[0][0] if self.finals else None

    @property
    def text(self) -> str:
        """What the server heard (a repeated final is a violation, not more words)."""
        return self.finals[0][1] if self.finals else ""


@dataclass
class Response:
    """One agent response and its audio as it arrived."""

    id: str
    created_at: float
    utterance_id: str | None
    first_audio_at: float | None = None
    last_audio_at: float | None = None
    audio_ms: float = 0.0
    stall_ms: float = 0.0  # worst gap a client playing from the first frame would hear
    played_until: float | None = None  # when a player started at the first frame ends it
    cleared_at: float | None = None
    audio_done_at: float | None = None
    done_at: float | None = None
    status: str | None = None

    @property
    def playing(self) -> bool:
        return self.done_at is None and self.cleared_at is None and self.audio_done_at is None


class Conversation:
    """The server's side of one session, fed message by message."""

    def __init__(self, session_id: str = "?", output_rate: int = OUTPUT_RATE) -> None:
        self.session_id = session_id
        self.output_rate = output_rate
        self.utterances: dict[str, Utterance] = {}
        self.responses: dict[str, Response] = {}
        self.active: Response | None = None
        self.errors: list[tuple[float, str]] = []
        self.violations: list[str] = []
        self.close_code: int | None = None
        self.closed_by_server = False
        self._reported: set[tuple[str, str]] = set()

    def start(self, session: dict[str, Any]) -> None:
        """The session from `session.created`."""
        self.session_id = str(session.get("id", self.session_id))
        self.output_rate = int(session.get("output_sample_rate", self.output_rate))

    # ------------------------------------------------------------------ messages

    def feed(self, at: float, message: dict[str, Any] | bytes) -> None:
        if isinstance(message, bytes):
            self._audio(at, len(message))
            return
        kind = str(message.get("type"))
        handler = self._HANDLERS.get(kind)
        if handler is not None:
            handler(self, at, message)

    def _session_updated(self, at: float, event: dict[str, Any]) -> None:
        self.output_rate = int(event.get("session", {}).get("output_sample_rate", OUTPUT_RATE))

    def _speech_started(self, at: float, event: dict[str, Any]) -> None:
        uid = str(event.get("utterance_id"))
        if uid in self.utterances:
            self._violate("started", uid, f"speech.started twice for utterance {uid}")
        utterance = Utterance(uid, started_at=at, audio_start_ms=event.get("audio_start_ms"))
        playing = self.active
        if playing is not None and playing.playing and playing.audio_ms > 0:
            utterance.over_response, utterance.over_audio_ms = playing.id, playing.audio_ms
        self.utterances[uid] = utterance

    def _speech_stopped(self, at: float, event: dict[str, Any]) -> None:
        uid = str(event.get("utterance_id"))
        utterance = self.utterances.setdefault(uid, Utterance(uid))  # commit: no start needed
        if utterance.stopped_at is not None:
            self._violate("stopped", uid, f"speech.stopped twice for utterance {uid}")
            return
        utterance.stopped_at, utterance.audio_end_ms = at, event.get("audio_end_ms")

    def _partial(self, at: float, event: dict[str, Any]) -> None:
        utterance = self.utterances.get(str(event.get("utterance_id")))
        if utterance is not None and utterance.finals:
            uid = utterance.id
            self._violate("partial", uid, f"transcript.partial after transcript.final for {uid}")

    def _final(self, at: float, event: dict[str, Any]) -> None:
        uid = str(event.get("utterance_id"))
        utterance = self.utterances.get(uid)
        if utterance is None or utterance.stopped_at is None:
            self._violate("final", uid, f"transcript.final for {uid} before its speech.stopped")
            utterance = self.utterances.setdefault(uid, Utterance(uid))
        elif utterance.finals:
            self._violate("final", uid, f"two transcript.final for utterance {uid}")
        utterance.finals.append((at, str(event.get("text", ""))))

    def _created(self, at: float, event: dict[str, Any]) -> None:
        rid = str(event.get("response_id"))
        if rid in self.responses:
            self._violate("created", rid, f"response.created twice for {rid}")
            return
        if self.active is not None and self.active.done_at is None:
            old = self.active.id
            self._violate("overlap", rid, f"response {rid} created before {old} was done")
        uid = event.get("utterance_id")
        self.active = Response(rid, at, None if uid is None else str(uid))
        self.responses[rid] = self.active

    def _audio(self, at: float, size: int) -> None:
        response = self.active
        if response is None or not response.playing:
            last = "none" if response is None else response.id
            what = "response.done" if response is None or response.done_at else "its end"
            if response is not None and response.cleared_at is not None:
                what = "output_audio.clear"
            self._violate("audio", last, f"agent audio after {what} (last response: {last})")
            return
        if response.first_audio_at is None:
            response.first_audio_at = at
        gap = (at - response.first_audio_at) * 1000 - response.audio_ms
        response.stall_ms = max(response.stall_ms, gap)
        response.last_audio_at = at
        seconds = size / 2 / self.output_rate
        response.audio_ms += seconds * 1000
        # a player that waits when its buffer runs dry: each frame plays after the one before
        response.played_until = max(response.played_until or at, at) + seconds

    def _cleared(self, at: float, event: dict[str, Any]) -> None:
        response = self._known(str(event.get("response_id")), "output_audio.clear")
        if response is not None:
            response.cleared_at = at

    def _audio_done(self, at: float, event: dict[str, Any]) -> None:
        response = self._known(str(event.get("response_id")), "response.audio.done")
        if response is None:
            return
        response.audio_done_at = at
        said = float(event.get("audio_ms", 0))
        if abs(said - response.audio_ms) > AUDIO_MS_TOLERANCE:
            got = f"{response.audio_ms:.0f}"
            text = f"response.audio.done for {response.id} says {said:.0f} ms, {got} ms arrived"
            self._violate("audio_ms", response.id, text)

    def _done(self, at: float, event: dict[str, Any]) -> None:
        response = self._known(str(event.get("response_id")), "response.done")
        if response is None:
            return
        if response.done_at is not None:
            self._violate("done", response.id, f"response.done twice for {response.id}")
            return
        response.done_at, response.status = at, str(event.get("status"))
        if response.cleared_at is not None and response.status != "cancelled":
            text = f"{response.id} got output_audio.clear but ended {response.status!r}"
            self._violate("status", response.id, text)
        if self.active is response:
            self.active = None

    def _error(self, at: float, event: dict[str, Any]) -> None:
        self.errors.append((at, str(event.get("code", "unknown"))))

    def _known(self, rid: str, kind: str) -> Response | None:
        response = self.responses.get(rid)
        if response is None:
            self._violate("unknown", rid, f"{kind} for unknown response {rid}")
        return response

    _HANDLERS: Final = {
        "session.updated": _session_updated,
        "speech.started": _speech_started,
        "speech.stopped": _speech_stopped,
        "transcript.partial": _partial,
        "transcript.final": _final,
        "response.created": _created,
        "output_audio.clear": _cleared,
        "response.audio.done": _audio_done,
        "response.done": _done,
        "error": _error,
    }

    # ------------------------------------------------------------------ the end

    def connection_closed(self, code: int | None, asked: bool) -> None:
        """How the connection ended; `asked`: the client sent `session.close` first."""
        self.close_code = code
        if asked and code == 1000:
            return
        self.closed_by_server = True
        if code not in LEGIT_CLOSE_CODES:
            text = (
                f"session.close answered with close code {code}"
                if asked
                else f"connection closed unexpectedly (code {code})"
            )
            self._violate("close", str(code), text)

    def settled(self) -> bool:
        """Nothing outstanding: every utterance has its transcript, no response is open."""
        waiting = sum(1 for u in self.utterances.values() if u.stopped_at and not u.finals)
        responding = self.active is not None and self.active.done_at is None
        return waiting <= self._asr_failures() and not responding

    def finish(self) -> None:
        """End-of-session checks (after the client waited for everything outstanding)."""
        allowed = self._asr_failures()
        for utterance in self.utterances.values():
            if utterance.stopped_at is not None and not utterance.finals:
                if allowed > 0:
                    allowed -= 1
                    continue
                text = f"no transcript.final (nor error) for utterance {utterance.id}"
                self._violate("missing", utterance.id, text)
        for response in self.responses.values():
            if response.done_at is None:
                self._violate("missing", response.id, f"no response.done for {response.id}")
        for utterance in self.utterances.values():
            self._check_barge_in(utterance)

    def _asr_failures(self) -> int:
        return sum(1 for _, code in self.errors if code in ASR_FAILURES)

    def _check_barge_in(self, utterance: Utterance) -> None:
        response = self.responses.get(utterance.over_response or "")
        if response is None or response.status != "completed":
            return
        start, end = utterance.audio_start_ms, utterance.audio_end_ms
        spoke_ms = BARGE_IN_SPEECH_MS if start is None or end is None else end - start
        remaining = response.audio_ms - utterance.over_audio_ms
        if spoke_ms >= BARGE_IN_SPEECH_MS and remaining >= BARGE_IN_REMAINING_MS:
            text = (
                f"barge-in ignored: {response.id} ended 'completed', playing {remaining:.0f} ms "
                f"more audio after the user spoke over it (utterance {utterance.id})"
            )
            self._violate("barge_in", response.id, text)

    def _violate(self, kind: str, key: str, text: str) -> None:
        if (kind, key) in self._reported or len(self.violations) >= MAX_VIOLATIONS:
            return
        self._reported.add((kind, key))
        self.violations.append(f"session {self.session_id}: {text}")
