"""A gateway session with fake engines, a fake bus and a fake socket, on virtual time.

The session under test is the real `Session` with the real `Listener`, segmenter,
chunker and response ordering. Around it:
- `EnergyVad`: speech probability 1 for loud windows, 0 for quiet ones (scripted VAD);
- `FakeBus`: instant in-process "engines" that answer ASR and TTS jobs after set delays
  and stop a cancelled response between chunks, as the real workers do;
- `FakeSocket`: what the real `Channel` reads from and writes to, with timestamps.
Tests run on a `looptime` event loop (`on_virtual_time`): sleeps and timeouts take no
wall time, and every timestamp is exact event-loop time.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import looptime
import numpy as np
from starlette.websockets import WebSocketState

from services.common.audio.listener import Listener
from services.common.audio.pcm import pcm16_to_float
from services.common.audio.vad import SileroVad, VadSettings
from services.common.auth.limits import NO_METER, AudioMeter
from services.common.bus.messages import AsrJob, BusResult, TtsJob
from services.common.protocol.events import SessionConfig, SessionCreated
from services.common.service.ws import Channel, Disconnected
from services.gateway.agent import AGENTS, Agent, AgentOutput, ClientTools, Turn
from services.gateway.bus import GatewayBus
from services.gateway.codec import Codec, NativeCodec, SessionChannel
from services.gateway.session import Session, SessionServices
from services.gateway.settings import GatewaySection
from services.gateway.store import SessionStore, Unheard
from services.gateway.turn_end import EndOfTurn, SilenceOnly, listening

RATE = 16000
WINDOW = 512


def on_virtual_time(test: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """Run an async test on its own fake-time loop (the loop's clock jumps to the next timer)."""

    @functools.wraps(test)
    def run() -> None:
        loop = looptime.new_event_loop()
        try:
            loop.run_until_complete(test())
        finally:
            loop.close()

    return run


class _EnergyStream:
    def __init__(self) -> None:
        self._pending = np.zeros(0, dtype=np.float32)

    def push(self, samples: np.ndarray) -> np.ndarray:
        self._pending = np.concatenate([self._pending, samples])
        k = len(self._pending) // WINDOW
        windows = self._pending[: k * WINDOW].reshape(k, WINDOW)
        self._pending = self._pending[k * WINDOW :]
        loud = np.sqrt((windows**2).mean(axis=1)) > 0.01
        return loud.astype(np.float32)


class EnergyVad:
    """Stands in for Silero: loud windows are speech."""

    def new_stream(self) -> _EnergyStream:
        return _EnergyStream()


def tone(ms: int, rate: int = RATE) -> bytes:
    """Loud enough to be speech to `EnergyVad`."""
    t = np.arange(ms * rate // 1000) / rate
    return (np.sin(2 * np.pi * 220 * t) * 8000).astype(np.int16).tobytes()


def silence(ms: int, rate: int = RATE) -> bytes:
    return bytes(2 * (ms * rate // 1000))


class FakeSocket:
    """The WebSocket side the real Channel talks to; records what the session sends."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.incoming: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.audio: list[tuple[float, bytes]] = []
        self.application_state = WebSocketState.CONNECTED
        self.closed_with: tuple[int, str] | None = None
        self.changed = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        return await self.incoming.get()

    async def send_text(self, text: str) -> None:
        self.events.append((self.loop.time(), json.loads(text)))
        self.changed.set()

    async def send_bytes(self, data: bytes) -> None:
        self.audio.append((self.loop.time(), data))
        self.changed.set()

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.closed_with = (code, reason)
        self.application_state = WebSocketState.DISCONNECTED


@dataclass
class FakeBus:
    """In-process ASR and TTS "engines" behind the GatewayBus interface."""

    loop: asyncio.AbstractEventLoop
    transcripts: list[str] = field(default_factory=list)
    """Texts of the next utterances' transcripts, in order ("" once they run out)."""
    heard: dict[str, str] = field(default_factory=dict)
    """utterance id → its transcript (every final-mode job of an utterance hears the same)."""
    asr_delay_s: float = 0.2
    last_word_logprob: float | None = None
    """What every final says of its last word (None: the engine does not say)."""
    avg_logprob: float | None = None
    """What every final says of its words' mean log-probability (None: it does not say)."""
    language: str | None = None
    """The language every transcript says it heard (None: the engine does not say)."""
    tts_first_s: float = 0.05
    tts_chunk_s: float = 0.02
    """Between pieces: TTS runs faster than real time, as it must."""
    tts_ms_per_word: int = 400
    tts_piece_ms: int = 200
    cancel_delay_s: float = 0.0
    """How long a cancellation takes to reach Redis (a round trip)."""
    answer_asr: bool = True
    answer_partials: bool = True
    locate: bool = False
    """Final ASR jobs say where they lie (as the real bus does), and `job_audio` reads them
    back: the session then notes its utterances for a resume (its store must take the
    notes: `note_unheard`)."""
    entries: dict[str, tuple[AsrJob, bytes]] = field(default_factory=dict)
    reply_to: str = "va:results:test"
    deliver: Callable[[BusResult, bytes | None], None] = lambda result, audio: None
    asr_jobs: list[tuple[float, AsrJob, bytes]] = field(default_factory=list)
    tts_jobs: list[tuple[float, TtsJob]] = field(default_factory=list)
    cancelled: list[tuple[float, str]] = field(default_factory=list)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def submit_asr(self, job: AsrJob, pcm16: bytes) -> tuple[str, bytes] | None:
        self.asr_jobs.append((self.loop.time(), job, pcm16))
        where: tuple[str, bytes] | None = None
        if job.mode == "final" and self.locate:
            entry_id = f"{len(self.asr_jobs)}-0"
            self.entries[entry_id] = (job, pcm16)
            where = ("fake:asr:jobs", entry_id.encode())
        if job.mode == "partial" and self.answer_partials:
            text = f"partial {len(pcm16) // 32} ms"
            self.loop.call_later(self.asr_delay_s, self._asr_result, job, text)
        elif job.mode == "final" and self.answer_asr:
            if job.utterance_id not in self.heard:  # a speculation and its final hear alike
                self.heard[job.utterance_id] = self.transcripts.pop(0) if self.transcripts else ""
            text = self.heard[job.utterance_id]
            self.loop.call_later(self.asr_delay_s, self._asr_result, job, text)
        return where

    async def job_audio(self, stream: str, entry_id: str) -> tuple[AsrJob, bytes] | None:
        return self.entries.get(entry_id)

    def _asr_result(self, job: AsrJob, text: str) -> None:
        final = job.mode == "final"
        result = job.result(
            text,
            language=self.language,
            last_word_logprob=self.last_word_logprob if final else None,
            avg_logprob=self.avg_logprob if final else None,
        )
        self.deliver(result, None)

    async def submit_tts(self, job: TtsJob) -> None:
        self.tts_jobs.append((self.loop.time(), job))
        task = self.loop.create_task(self._synthesize(job))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _synthesize(self, job: TtsJob) -> None:
        total_ms = self.tts_ms_per_word * max(1, len(job.text.split()))
        pieces = -(-total_ms // self.tts_piece_ms)
        await asyncio.sleep(self.tts_first_s)
        for index in range(pieces):
            if self.is_cancelled(job.response_id):
                break  # the worker stops between chunks
            pcm = tone(self.tts_piece_ms, job.sample_rate)
            self.deliver(job.chunk(index), pcm)
            await asyncio.sleep(self.tts_chunk_s)
        else:
            self.deliver(job.done(pieces, pieces * self.tts_piece_ms, "completed"), None)
            return
        self.deliver(job.done(index, index * self.tts_piece_ms, "cancelled"), None)

    def is_cancelled(self, response_id: str) -> bool:
        return any(r == response_id for _, r in self.cancelled)

    async def cancel(self, response_id: str) -> None:
        if self.cancel_delay_s:
            await asyncio.sleep(self.cancel_delay_s)
        self.cancelled.append((self.loop.time(), response_id))


class Harness:
    """Drives one session: the user's side (audio, messages) and what came back."""

    def __init__(self, session: Session, socket: FakeSocket, bus: FakeBus) -> None:
        self.session = session
        self.socket = socket
        self.bus = bus
        self.loop = bus.loop

    async def say(self, *parts: bytes, frame_ms: int = 20, rate: int = RATE) -> float:
        """Stream audio (PCM16 at `rate`) at real-time pace; returns the time its last
        frame went out."""
        pcm = b"".join(parts)
        step = 2 * rate * frame_ms // 1000
        for start in range(0, len(pcm), step):
            await self.socket.incoming.put(
                {"type": "websocket.receive", "bytes": pcm[start : start + step]}
            )
            await asyncio.sleep(frame_ms / 1000)
        return self.loop.time()

    async def send(self, message: dict[str, Any]) -> None:
        await self.socket.incoming.put({"type": "websocket.receive", "text": json.dumps(message)})
        await asyncio.sleep(0)

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e for _, e in self.socket.events if e.get("type") == kind]

    def time_of(self, kind: str, nth: int = 0) -> float:
        return [t for t, e in self.socket.events if e.get("type") == kind][nth]

    async def wait_for(self, kind: str, count: int = 1, timeout_s: float = 60.0) -> dict[str, Any]:
        """Until `count` events of `kind` were sent (virtual time)."""
        async with asyncio.timeout(timeout_s):
            while len(self.of_type(kind)) < count:
                self.socket.changed.clear()
                await self.socket.changed.wait()
        return self.of_type(kind)[count - 1]

    def audio_bytes(self, since: float = 0.0, until: float = float("inf")) -> int:
        return sum(len(a) for t, a in self.socket.audio if since <= t <= until)


@contextlib.contextmanager
def tts_as(synthesize: Callable[[FakeBus, TtsJob], Coroutine[Any, Any, None]]) -> Iterator[None]:
    """Every FakeBus's TTS is `synthesize` meanwhile (a stall, a failure; it may call the
    fake's own, taken before: `FakeBus._synthesize`)."""
    original = FakeBus._synthesize
    FakeBus._synthesize = synthesize  # type: ignore[method-assign]
    try:
        yield
    finally:
        FakeBus._synthesize = original  # type: ignore[method-assign]


class RecordingStore:
    """A session store that keeps what each save held (`records`: the history, the answer
    owed, the utterances taken) and each note of where an utterance lies (`notes`)."""

    def __init__(self) -> None:
        self.records: list[tuple[list[Turn], str | None, tuple[str, ...]]] = []
        self.notes: list[Unheard | None] = []

    @property
    def saves(self) -> list[tuple[list[Turn], str | None]]:
        """Each save's history and answer owed."""
        return [(history, owed) for history, owed, _ in self.records]

    async def save(
        self,
        config: SessionConfig,
        history: list[Turn],
        tenant: str,
        owed: str | None = None,
        taken: tuple[str, ...] = (),
    ) -> bool:
        self.records.append((list(history), owed, taken))
        return True

    async def note_unheard(self, session_id: str, unheard: Unheard | None) -> None:
        self.notes.append(unheard)


def scripted(
    script: Callable[[], AsyncIterator[AgentOutput]], prepare_safe: bool = True
) -> Callable[[], Agent]:
    """An agent (as `echo`) that says what `script` yields, whatever it is asked: text, tool
    calls and their results, pauses (virtual time)."""

    class Scripted:
        name = "echo"

        def __init__(self) -> None:
            self.prepare_safe = prepare_safe

        async def respond(
            self,
            history: list[Turn],
            instructions: str | None = None,
            client_tools: ClientTools | None = None,
        ) -> AsyncIterator[AgentOutput]:
            async for step in script():
                yield step

    return Scripted


@asynccontextmanager
async def running_session(
    settings: GatewaySection | None = None,
    vad: VadSettings | None = None,
    agents: dict[str, Callable[[], Agent]] = AGENTS,
    end_of_turn: EndOfTurn | None = None,
    partials: bool = True,
    meter: AudioMeter = NO_METER,
    history: list[Turn] | None = None,
    owed: str | None = None,
    taken: tuple[str, ...] = (),
    unheard: Unheard | None = None,
    store: SessionStore | None = None,
    codec: Codec | None = None,
    config: SessionConfig | None = None,
    **bus_options: Any,
) -> AsyncIterator[Harness]:
    """A session serving a fake socket (with `history`, one resumed, and the answer it is
    `owed`); the user hangs up at the end."""
    loop = asyncio.get_running_loop()
    settings = settings or GatewaySection()
    socket = FakeSocket(loop)
    bus = FakeBus(loop, **bus_options)
    policy = end_of_turn or SilenceOnly(settings)
    hearing = listening(policy, vad or VadSettings(), settings)
    listener = Listener(cast(SileroVad, EnergyVad()), hearing, 16000)
    config = config or SessionConfig(id="sess_test", output_sample_rate=16000, partials=partials)
    try:
        async with asyncio.TaskGroup() as tasks:
            services = SessionServices(
                cast(GatewayBus, bus), settings, agents, policy, store, clock=loop.time
            )
            io = Channel(socket, "gateway", 1 << 20)  # type: ignore[arg-type]
            channel = SessionChannel(io, codec or NativeCodec())
            if codec is not None:  # a wire format of its own learns the formats from this
                await channel.send(SessionCreated(session=config))
            session = Session(
                config,
                channel,
                listener,
                services,
                tasks,
                tenant="default",
                meter=meter,
                history=list(history or []),
                owed=owed,
                taken=taken,
                unheard=unheard,
            )
            bus.deliver = session.deliver

            async def serve() -> None:
                with contextlib.suppress(Disconnected):
                    await session.serve()

            server = tasks.create_task(serve())
            try:
                yield Harness(session, socket, bus)
            finally:
                await socket.incoming.put({"type": "websocket.disconnect"})
                await server
                for task in list(bus._tasks):
                    task.cancel()
    except* Disconnected:
        pass  # the user hung up: the session's reader ended it


def pcm_ms(pcm: bytes, rate: int = 16000) -> float:
    return len(pcm) / 2 / rate * 1000


def loud(pcm: bytes) -> bool:
    return bool(np.abs(pcm16_to_float(pcm)).max() > 0.05)
