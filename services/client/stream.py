"""A `/v1/stream` client: streams audio at real-time pace and records what comes back.

Used by `voice-agent client`, the end-to-end tests and the benchmarks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import wave
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from ssl import SSLContext
from typing import Any

import numpy as np
import websockets

from services.client.credentials import bearer
from services.common.audio.pcm import (
    ALLOWED_SAMPLE_RATES,
    AudioF32,
    decode_file,
    float_to_pcm16,
    pcm16_to_float,
    resample,
    speech_end,
)


class SessionRefused(Exception):
    """The gateway closed the connection or sent an `error` instead of `session.created`
    (draining or full: `capacity`, a used-up quota, a refused credential...)."""

    def __init__(
        self,
        message: str,
        code: str | None = None,
        close_code: int | None = None,
        retry_after_s: float | None = None,
    ):
        super().__init__(message)
        self.code = code
        """The `error` event's code, when one came."""
        self.close_code = close_code
        """The WebSocket close code, when the connection closed (1013: at capacity)."""
        self.retry_after_s = retry_after_s
        """When the gateway said trying again may succeed: after this many seconds."""


class SessionClosed(Exception):
    """The gateway closed a session after `session.created` (1012: it is draining, and the
    session resumes with its id; 1008: a limit or quota; 1011: it failed; 1013: overloaded)."""

    def __init__(self, session_id: str, close_code: int | None, reason: str) -> None:
        shown = f"{close_code}: {reason}" if reason else str(close_code)
        super().__init__(f"the gateway closed session {session_id} ({shown})")
        self.session_id = session_id
        self.close_code = close_code
        self.reason = reason


class ReplyNotSaved(Exception):
    """The agent's audio could not be written where it was asked to go."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"cannot write {path}: {reason}")
        self.path = path
        self.reason = reason


class NoAnswer(TimeoutError):
    """The event waited for did not come in time (the session goes on)."""


@dataclass
class Received:
    """Everything one turn brought back, with arrival times (time.monotonic)."""

    events: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    audio: bytearray = field(default_factory=bytearray)
    first_audio_at: float | None = None
    last_audio_at: float | None = None
    last_speech_sent_at: float | None = None

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [event for _, event in self.events if event.get("type") == kind]

    def time_of(self, kind: str) -> float | None:
        return next((t for t, event in self.events if event.get("type") == kind), None)

    def responses_created(self, since: float) -> list[tuple[float, str]]:
        """(arrival time, response id) of each `response.created` that came at or after
        `since` (e.g. the end of the speech sent: the answers to it, not a cut-off's)."""
        return [
            (at, str(event["response_id"]))
            for at, event in self.events
            if at >= since and event.get("type") == "response.created"
        ]

    def ms_after_speech(self, kind: str) -> float | None:
        """When the first `kind` event came, in ms after the end of the speech sent."""
        at = self.time_of(kind)
        if at is None or self.last_speech_sent_at is None:
            return None
        return round((at - self.last_speech_sent_at) * 1000, 1)

    @property
    def voice_to_voice_ms(self) -> float | None:
        """End of the speech sent → first agent audio frame received."""
        if self.first_audio_at is None or self.last_speech_sent_at is None:
            return None
        return (self.first_audio_at - self.last_speech_sent_at) * 1000


def read_wav(path: Path) -> tuple[AudioF32, int]:
    """A mono PCM16 wav file as float samples and its rate."""
    with wave.open(str(path), "rb") as wav:
        if wav.getsampwidth() != 2:
            raise ValueError(f"{path}: only 16-bit PCM wav is supported")
        frames = wav.readframes(wav.getnframes())
        audio = pcm16_to_float(frames)
        if wav.getnchannels() > 1:
            audio = audio.reshape(-1, wav.getnchannels()).mean(axis=1).astype(np.float32)
        return audio, wav.getframerate()


def read_audio(path: Path) -> tuple[AudioF32, int]:
    """Speech from a file: a PCM16 wav as it is, anything else PyAV decodes (a float or
    24-bit wav, flac, mp3, ogg...) at 16 kHz. InvalidAudio when it is not audio."""
    try:
        return read_wav(path)
    except (wave.Error, ValueError, EOFError):
        return decode_file(path.read_bytes(), 16000), 16000


def write_wav(path: Path, pcm16: bytes, rate: int) -> None:
    """Write mono PCM16 bytes as a wav file (OSError when the file cannot be made)."""
    # the file is opened first: `wave.open(name)` failing to open it leaves a half-built
    # writer whose __del__ prints a second traceback ("Exception ignored in ... Wave_write")
    with path.open("wb") as file, wave.open(file, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(pcm16)


OnMessage = Callable[[float, dict[str, Any] | bytes], None]
"""Sees every message the server sends after `session.created`, with its arrival time."""


class StreamClient:
    """One `/v1/stream` session.

    Besides each turn's `Received`, it keeps what a load generator needs: every
    message to `on_message`, how late each paced frame left (`send_lag_ms`), and how
    the connection ended (`close_code`, `closed`).
    """

    def __init__(
        self,
        url: str,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        ssl: SSLContext | None = None,
        on_message: OnMessage | None = None,
        open_timeout_s: float = 10.0,
        api_key: str | None = None,
    ) -> None:
        self.url = url
        self.api_key = api_key
        """An API key or client token, sent as `Authorization: Bearer` (docs/auth.md)."""
        self.ssl = ssl
        self.on_event = on_event
        self.on_message = on_message
        self.open_timeout_s = open_timeout_s
        self.ws: Any = None
        self.session: dict[str, Any] = {}
        self.send_lag_ms: list[float] = []
        self.close_code: int | None = None
        self.closed = asyncio.Event()
        self._received = Received()
        self._reader: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()

    async def __aenter__(self) -> StreamClient:
        tls: dict[str, Any] = {} if self.ssl is None else {"ssl": self.ssl}  # else: default
        if self.api_key:
            tls["additional_headers"] = bearer(self.api_key)
        self.ws = await websockets.connect(
            self.url,
            max_size=None,
            compression=None,
            open_timeout=self.open_timeout_s,
            **tls,
        )
        created = await self._first_message()
        self.session = created["session"]
        self.notice: str | None = created.get("notice")
        """Why the session is not what one might expect (e.g. no LLM: `echo` answers)."""
        self._reader = asyncio.create_task(self._read(), name="client-reader")
        return self

    async def _first_message(self) -> dict[str, Any]:
        """`session.created`; SessionRefused for anything else (the connection is closed)."""
        try:
            first = await self.ws.recv()
        except websockets.ConnectionClosed as exc:
            close = exc.rcvd
            code = None if close is None else close.code
            reason = close.reason if close is not None and close.reason else "no reason given"
            raise SessionRefused(
                f"the gateway closed the connection ({code}: {reason})", close_code=code
            ) from None
        try:
            message = json.loads(first)
        except (TypeError, ValueError):
            message = None
        if isinstance(message, dict) and message.get("type") == "session.created":
            return message
        with contextlib.suppress(TimeoutError):  # the gateway closes after its error
            await asyncio.wait_for(self.ws.wait_closed(), 2)
        await self.ws.close()
        if isinstance(message, dict) and message.get("type") == "error":
            raise SessionRefused(
                f"the gateway refused the session: {message.get('message', message)}",
                code=message.get("code"),
                close_code=self.ws.close_code,
                retry_after_s=message.get("retry_after_s"),
            )
        raise SessionRefused(
            f"not a voice-agent stream: its first message was {str(first)[:200]!r}"
        )

    async def __aexit__(self, *_: object) -> None:
        if self._reader is not None:
            self._reader.cancel()
        await self.ws.close()

    @property
    def output_rate(self) -> int:
        return int(self.session.get("output_sample_rate", 24000))

    async def send(self, message: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(message))

    @property
    def received(self) -> Received:
        """What came back since the connection opened, or since `new_turn`."""
        return self._received

    def new_turn(self) -> Received:
        """Start recording a fresh turn."""
        self._received = Received()
        return self._received

    async def speak(
        self, audio: AudioF32, rate: int, frame_ms: int = 20, lead_silence_ms: int = 300
    ) -> Received:
        """Stream audio at real-time pace (resampled to the session's input rate).

        A live microphone hears a little silence before speech: `lead_silence_ms` of it
        is sent first. `last_speech_sent_at` is when the frame holding the speech's last
        voiced sample was sent (voice-to-voice starts there: the earliest the gateway can
        have heard the end): the silence a clip or a recording ends with is sent too (a
        microphone would send it), but the agent may answer during it.
        """
        received = self._received
        input_rate = rate if rate in ALLOWED_SAMPLE_RATES else 16000
        if input_rate != self.session.get("input_sample_rate"):
            await self.send(
                {"type": "session.update", "session": {"input_sample_rate": input_rate}}
            )
            await self.wait_for("session.updated")
        if input_rate != rate:
            audio = resample(audio, rate, input_rate)
        lead = np.zeros(input_rate * lead_silence_ms // 1000, dtype=np.float32)
        audio = np.concatenate([lead, audio])
        step = input_rate * frame_ms // 1000
        frames = (float_to_pcm16(audio[i : i + step]) for i in range(0, audio.size, step))
        last_voiced = max(0, speech_end(audio) - 1) // step
        await self._paced(frames, frame_ms, last_speech_frame=last_voiced)
        return received

    async def _paced(
        self,
        frames: Iterable[bytes],
        frame_ms: int,
        until: Callable[[], bool] | None = None,
        last_speech_frame: int | None = None,
    ) -> bool:
        """Send frames at real-time pace, stopping early once `until()` holds (then True).

        How late each frame leaves against that pace goes to `send_lag_ms`; when frame
        `last_speech_frame` leaves, the turn's `last_speech_sent_at` is set.
        """
        start = time.monotonic()
        for i, frame in enumerate(frames):
            if until is not None and until():
                return True
            now = time.monotonic()
            self.send_lag_ms.append(max(0.0, (now - start - i * frame_ms / 1000) * 1000))
            if i == last_speech_frame:
                self._received.last_speech_sent_at = now
            await self.ws.send(frame)
            delay = start + (i + 1) * frame_ms / 1000 - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        return until is not None and until()

    async def silence_while(
        self, waiting: Callable[[], bool], timeout_s: float, frame_ms: int = 20
    ) -> bool:
        """Stream silence (a live microphone) while `waiting()` holds, at most `timeout_s`.

        Returns False when the time ran out first.
        """
        rate = int(self.session.get("input_sample_rate", 16000))
        frame = bytes(2 * rate * frame_ms // 1000)
        count = max(1, round(timeout_s * 1000 / frame_ms))
        return await self._paced((frame for _ in range(count)), frame_ms, lambda: not waiting())

    async def silence_until(
        self,
        kind: str,
        timeout_s: float,
        frame_ms: int = 20,
        predicate: Callable[[dict[str, Any]], bool] | None = None,
    ) -> dict[str, Any]:
        """Keep streaming silence (as a live microphone would) until an event arrives."""
        await self.silence_while(lambda: self._find(kind, predicate) is None, timeout_s, frame_ms)
        found = self._find(kind, predicate)
        if found is not None:
            return found
        raise NoAnswer(
            f"no {kind} within {timeout_s} s; got {[e for _, e in self._received.events]}"
        )

    async def silence(self, seconds: float, frame_ms: int = 20) -> None:
        """Stream silence for a while, as a live microphone would."""
        await self.silence_while(lambda: True, seconds, frame_ms)

    async def wait_for(
        self,
        kind: str,
        timeout_s: float = 10.0,
        predicate: Callable[[dict[str, Any]], bool] | None = None,
    ) -> dict[str, Any]:
        """Wait (sending nothing) for an event of this turn."""
        async with asyncio.timeout(timeout_s):
            while (found := self._find(kind, predicate)) is None:
                self._changed.clear()
                await self._changed.wait()
        return found

    def _find(
        self, kind: str, predicate: Callable[[dict[str, Any]], bool] | None
    ) -> dict[str, Any] | None:
        for _, event in self._received.events:
            if event.get("type") == kind and (predicate is None or predicate(event)):
                return event
        return None

    async def _read(self) -> None:
        try:
            async for message in self.ws:
                self._on_frame(time.monotonic(), message)
        except websockets.ConnectionClosed:
            pass  # recorded below, as a clean close is
        finally:
            self.close_code = self.ws.close_code
            self.closed.set()
            self._changed.set()

    def _on_frame(self, now: float, message: str | bytes) -> None:
        received = self._received
        if isinstance(message, bytes):
            if received.first_audio_at is None:
                received.first_audio_at = now
            received.last_audio_at = now
            received.audio.extend(message)
            if self.on_message is not None:
                self.on_message(now, message)
        else:
            event = json.loads(message)
            received.events.append((now, event))
            if self.on_event is not None:
                self.on_event(event)
            if self.on_message is not None:
                self.on_message(now, event)
        self._changed.set()


async def talk(
    url: str, wav: Path, out: Path | None, timeout_s: float = 30.0, api_key: str | None = None
) -> Received:
    """Speak a wav file to the agent, print events, save the reply audio."""

    def show(event: dict[str, Any]) -> None:
        print(json.dumps(event), flush=True)

    audio, rate = read_audio(wav)
    async with StreamClient(url, on_event=show, api_key=api_key) as client:
        created: dict[str, Any] = {"type": "session.created", "session": client.session}
        show(created if client.notice is None else {**created, "notice": client.notice})
        try:
            received = await _one_turn(client, audio, rate, timeout_s)
        except websockets.ConnectionClosed as exc:
            raise _ended(client, exc) from None
        except TimeoutError:
            if not client.closed.is_set():
                raise  # a real timeout, on a session still open
            raise _ended(client, None) from None
        if out is not None:
            _save(out, bytes(received.audio), client.output_rate)
        if received.voice_to_voice_ms is not None:
            print(
                f"voice-to-voice: {received.voice_to_voice_ms:.0f} ms (from the end of the speech)",
                flush=True,
            )
        with contextlib.suppress(websockets.ConnectionClosed):  # it may have ended it already
            await client.send({"type": "session.close"})
        return received


async def _one_turn(client: StreamClient, audio: AudioF32, rate: int, timeout_s: float) -> Received:
    """Speak `audio`, then stream silence until the agent's response is done."""
    client.new_turn()
    received = await client.speak(audio, rate)
    await client.silence_until("response.done", timeout_s)
    return received


def _ended(client: StreamClient, exc: websockets.ConnectionClosed | None) -> SessionClosed:
    """How the gateway ended `client`'s session: the close frame it sent (1006 when none
    came), from `exc` or, once the reader saw the end, from the connection."""
    session_id = str(client.session.get("id", "?"))
    if exc is None:
        return SessionClosed(session_id, client.ws.close_code, client.ws.close_reason or "")
    if exc.rcvd is None:
        return SessionClosed(session_id, 1006, "the connection dropped")
    return SessionClosed(session_id, exc.rcvd.code, exc.rcvd.reason)


def _save(out: Path, pcm16: bytes, rate: int) -> None:
    """The reply as a wav file at `out`; ReplyNotSaved when it cannot be written."""
    try:
        write_wav(out, pcm16, rate)
    except OSError as exc:
        raise ReplyNotSaved(out, exc.strerror or str(exc)) from None
    print(f"saved {len(pcm16) // 2} samples of agent audio to {out}", flush=True)
