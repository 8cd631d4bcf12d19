"""A phone call through `/v1/twilio`, with no phone network: a simulated Twilio stream
(tests/twilio_call.py: Twilio's documented messages, espeak-ng speech in mu-law at 8 kHz)
talks to the lite stack (Whisper tiny.en, Piper, the echo agent). The agent's audio is
decoded and transcribed again; barge-in sends `clear`; marks say what the caller heard."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import websockets

from services.common.audio.pcm import pcm16_to_float
from services.gateway import metrics
from services.gateway.session import Session
from tests.conftest import Stack
from tests.e2e.wire import recall
from tests.speech import speak, transcribed
from tests.twilio_call import TwilioCall

SENTENCE = "what is the weather like in paris today"
LONG = (
    "once upon a time there was a lighthouse keeper who climbed the stairs every night "
    "and lit the great lamp and watched the ships go by on the wide dark sea"
)


def _url(stack: Stack) -> str:
    return f"{stack.gateway.ws}/v1/twilio"


def _sessions(stack: Stack) -> dict[str, Any]:
    app: Any = stack.gateway.server.config.app  # the gateway's FastAPI app
    sessions: dict[str, Any] = app.state.sessions
    return sessions


async def _until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Wait (the call's own tasks run meanwhile) until `condition()` holds."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def _session(stack: Stack, call: TwilioCall) -> Session:
    """The call's session. The stack is shared: another test's session may still be
    closing, so it is the open one whose Twilio stream is this call's."""

    def ours() -> list[Any]:
        return [
            s
            for s in _sessions(stack).values()
            if getattr(s.channel.codec, "stream_sid", None) == call.stream_sid
            and not s.channel.closed
        ]

    await _until(lambda: len(ours()) == 1, 10, "the call's session")
    (session,) = ours()
    assert isinstance(session, Session)
    return session


async def _reply_played(call: TwilioCall, quiet_s: float = 1.5, timeout_s: float = 60) -> None:
    """Until the agent has spoken and then kept quiet for `quiet_s`."""

    def quiet() -> bool:
        media = call.heard.media_at
        return bool(media) and time.monotonic() - media[-1] > quiet_s

    await _until(quiet, timeout_s, "the agent's reply")


def _transcribe(stack: Stack, pcm8k: bytes) -> str:
    return transcribed(stack.asr.http, pcm16_to_float(pcm8k), 8000)


async def test_a_call_talks_to_the_agent(lite_stack: Stack) -> None:
    async with TwilioCall(_url(lite_stack), {"caller": "+15550100"}) as call:
        session = await _session(lite_stack, call)
        assert (session.config.input_format, session.config.input_sample_rate) == ("pcmu", 8000)
        assert (session.config.output_format, session.config.output_sample_rate) == ("pcmu", 8000)
        await call.say(speak(SENTENCE, 8000))
        await _reply_played(call)
        await _until(lambda: not session.busy(), 10, "the turn to end")
        code = await call.stop()
    assert code == 1000
    user, agent = session.history[-2:]
    assert user.role == "user" and recall(SENTENCE, user.text) >= 0.6, user.text
    assert agent.role == "agent" and agent.text == user.text  # the echo agent, heard whole
    heard = _transcribe(lite_stack, call.pcm16())
    assert recall(SENTENCE, heard) >= 0.5, heard  # the agent's voice, through mu-law
    seconds = len(call.heard.audio) / 8000
    assert seconds > 1.0
    # a mark after each frame, named for the reply and the PCM16 bytes sent so far; each
    # went back once played
    names = [name for _, name in call.heard.marks]
    sent = [int(name.rpartition(":")[2]) for name in names]
    assert sent == sorted(sent) and sent[-1] == 2 * len(call.heard.audio)
    assert {name for _, name in call.heard.marks_returned} == set(names)
    assert not call.heard.clears and not call.heard.others


async def test_barge_in_clears_the_line_and_keeps_what_was_heard(lite_stack: Stack) -> None:
    async with TwilioCall(_url(lite_stack)) as call:
        session = await _session(lite_stack, call)
        await call.say(speak(LONG, 8000))
        # the agent says it back (several seconds): talk over it after a second of its audio
        await _until(lambda: len(call.heard.audio) > 8000, 90, "a second of the agent")
        await call.say(speak("stop please", 8000))
        await _until(lambda: bool(call.heard.clears), 15, "clear")
        cleared_at = call.heard.clears[0]
        heard_marks = [n for t, n in call.heard.marks_returned if t < cleared_at]
        await _until(lambda: len(session.history) >= 3, 30, "the interrupted turn saved")
        await call.stop()
    echoed = session.history[1]
    assert echoed.role == "agent"
    said = session.history[0].text.split()
    kept = echoed.text.split()
    assert 0 < len(kept) < len(said), (kept, said)  # only what the caller heard
    assert kept == said[: len(kept)]
    assert heard_marks, "marks came back before the clear"
    # no audio of that reply after the clear (a frame in flight at most): each frame is
    # followed by a mark naming its reply. The reply to "stop please" may start soon after
    # (its lead comes as a burst), so the reply is told by its marks, and "after" is the
    # order they came in, not a time (a loaded machine delivers late)
    interrupted = {name.partition(":")[0] for t, name in call.heard.marks if t < cleared_at}
    late = [
        name
        for t, name in call.heard.marks
        if t > cleared_at and name.partition(":")[0] in interrupted
    ]
    assert interrupted and len(late) <= 1, late


async def test_malformed_messages_never_end_the_call(lite_stack: Stack) -> None:
    invalid = metrics.TWILIO_MESSAGES.labels("invalid")
    before = invalid._value.get()
    async with TwilioCall(_url(lite_stack)) as call:
        session = await _session(lite_stack, call)
        assert call.ws is not None
        for bad in (
            "not json",
            '{"event": "no-such-event"}',
            '{"event": "media", "streamSid": "MZ", "media": {"payload": "%%%"}}',
            '{"event": "mark", "streamSid": "MZ"}',
            '["event"]',
        ):
            await call.ws.send(bad)
        await call.ws.send(b"\x00\x01")
        await _until(lambda: invalid._value.get() - before >= 6, 10, "six refusals counted")
        await call.say(speak(SENTENCE, 8000))  # the call goes on
        await _until(lambda: len(session.history) >= 2, 60, "the turn and its answer saved")
        assert await call.stop() == 1000


async def test_a_stream_that_never_starts_is_closed(lite_stack: Stack) -> None:
    before = set(_sessions(lite_stack))  # an earlier test's may still be ending
    async with websockets.connect(_url(lite_stack), open_timeout=10) as ws:
        await ws.send('{"event": "connected", "protocol": "Call", "version": "1.0.0"}')
        stop = {"event": "stop", "sequenceNumber": "1", "streamSid": "MZ1", "stop": {}}
        await ws.send(json.dumps(stop))
        await asyncio.wait_for(ws.wait_closed(), 10)
    assert ws.close_code == 1000
    assert not set(_sessions(lite_stack)) - before


def test_mu_law_speech_is_what_the_test_says() -> None:
    """The simulated line's speech survives mu-law (a sanity check of the test itself)."""
    from services.common.audio import g711
    from services.common.audio.pcm import float_to_pcm16

    audio = speak(SENTENCE, 8000)
    back = pcm16_to_float(g711.decode(g711.encode(float_to_pcm16(audio), "pcmu"), "pcmu"))
    assert np.corrcoef(audio, back)[0, 1] > 0.99


async def test_a_stream_in_another_format_is_closed_at_once(lite_stack: Stack) -> None:
    start = {
        "streamSid": "MZ1",
        "accountSid": "AC1",
        "callSid": "CA1",
        "mediaFormat": {"encoding": "audio/x-l16", "sampleRate": 16000, "channels": 1},
    }
    before = set(_sessions(lite_stack))
    async with websockets.connect(_url(lite_stack), open_timeout=10) as ws:
        await ws.send(json.dumps({"event": "start", "start": start, "streamSid": "MZ1"}))
        await asyncio.wait_for(ws.wait_closed(), 5)  # not the 10 s start timeout
    assert ws.close_code == 1000
    assert not set(_sessions(lite_stack)) - before
