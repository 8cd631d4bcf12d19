"""The Twilio and G.711 codecs, frame by frame: Twilio's messages to typed inputs and back,
and G.711 frames on the native and Realtime codecs."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping

import numpy as np
import pytest

from services.common.audio import g711
from services.common.audio.listener import to_vad_rate
from services.common.audio.polyphase import PolyphaseResampler
from services.common.protocol.events import (
    OutputAudioClear,
    ResponseCreated,
    SessionClose,
    SessionConfig,
    SessionPatch,
    SessionUpdated,
    TranscriptFinal,
)
from services.common.service.ws import Frame
from services.gateway import twilio_events as tw
from services.gateway.codec import AudioIn, AudioPlayed, NativeCodec
from services.gateway.realtime import RealtimeCodec
from services.gateway.twilio import TWILIO_SESSION, TwilioCodec

SID = "MZ" + "a" * 32
START = {
    "event": "start",
    "sequenceNumber": "1",
    "start": {
        "accountSid": "AC1",
        "streamSid": SID,
        "callSid": "CA1",
        "tracks": ["inbound"],
        "customParameters": {"token": "t0k"},
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
    },
    "streamSid": SID,
}


def _frame(message: Mapping[str, object]) -> Frame:
    return Frame(text=json.dumps(message))


def _media(payload: bytes, track: str = "inbound") -> Frame:
    media = {"track": track, "chunk": "1", "timestamp": "5"}
    encoded = base64.b64encode(payload).decode()
    return _frame({"event": "media", "streamSid": SID, "media": {**media, "payload": encoded}})


def _started() -> TwilioCodec:
    codec = TwilioCodec()
    assert codec.decode(_frame({"event": "connected", "protocol": "Call"})).inputs == []
    assert codec.decode(_frame(START)).inputs == []
    return codec


def test_start_then_media_is_pcm16_at_8k() -> None:
    codec = _started()
    assert (codec.stream_sid, codec.parameters) == (SID, {"token": "t0k"})
    tone = (np.sin(np.arange(160) / 3) * 8000).astype("<i2").tobytes()
    (audio,) = codec.decode(_media(g711.encode(tone, "pcmu"))).inputs
    assert isinstance(audio, AudioIn) and len(audio.pcm) == 320
    assert codec.decode(_media(b"\xff" * 160, track="outbound")).inputs == []
    long = codec.decode(_media(b"\xff" * 12000)).inputs  # 1.5 s: two frames of at most 1 s
    assert [len(a.pcm) for a in long if isinstance(a, AudioIn)] == [16000, 8000]


@pytest.mark.parametrize(
    "frame",
    [
        Frame(data=b"\x00"),
        Frame(text="{"),
        Frame(text='{"event": "nope"}'),
        Frame(text='{"event": "mark", "mark": {}}'),
        Frame(text='{"event": "media", "media": {"payload": "!!"}}'),
    ],
)
def test_malformed_messages_are_typed_errors(frame: Frame) -> None:
    with pytest.raises(tw.TwilioError) as refused:
        _started().decode(frame)
    assert refused.value.code == "invalid_twilio_message" and not refused.value.fatal


def test_media_before_start_and_a_foreign_format_are_refused() -> None:
    with pytest.raises(tw.TwilioError, match="before start"):
        TwilioCodec().decode(_media(b"\xff"))
    alaw = json.loads(json.dumps(START))
    alaw["start"]["mediaFormat"]["sampleRate"] = 16000
    codec = TwilioCodec()
    with pytest.raises(tw.TwilioError, match="8000"):
        codec.decode(_frame(alaw))
    assert codec.start_refused and codec.stream_sid is None


def test_audio_goes_out_as_media_then_a_mark_and_marks_come_back() -> None:
    codec = _started()
    config = SessionConfig.model_validate({"id": "s", **TWILIO_SESSION})
    assert codec.encode(SessionUpdated(session=config)) == []  # no Twilio message for it
    assert codec.encode(ResponseCreated(response_id="resp_1")) == []
    pcm = np.zeros(320, "<i2").tobytes()
    media, first = (json.loads(m) for m in codec.encode_audio(pcm))
    assert media["event"] == "media" and media["streamSid"] == SID
    assert base64.b64decode(media["media"]["payload"]) == b"\xff" * 320
    assert first == {"event": "mark", "streamSid": SID, "mark": {"name": "resp_1:640"}}
    mark = json.loads(codec.encode_audio(pcm)[1])  # a mark after every frame: bytes so far
    assert mark["mark"]["name"] == "resp_1:1280"
    back = codec.decode(_frame({"event": "mark", "streamSid": SID, "mark": mark["mark"]}))
    assert back.inputs == [AudioPlayed("resp_1", 1280)]
    other = {"event": "mark", "streamSid": SID, "mark": {"name": "someone-else"}}
    assert codec.decode(_frame(other)).inputs == []
    assert (
        codec.encode(TranscriptFinal(utterance_id="u", text="hi", audio_start_ms=0, audio_end_ms=9))
        == []
    )
    (clear,) = codec.encode(OutputAudioClear(response_id="resp_1"))
    assert json.loads(clear) == {"event": "clear", "streamSid": SID}
    assert codec.decode(_frame({"event": "stop", "streamSid": SID, "stop": {}})).inputs == [
        SessionClose(type="session.close")
    ]


def test_native_and_realtime_codecs_follow_the_session_formats() -> None:
    patch = SessionPatch(input_format="pcma", output_format="pcmu")
    config = SessionConfig(id="s").patched(patch.model_dump(exclude_none=True))
    update = SessionUpdated(session=config)
    pcm = (np.arange(-800, 800, 10)).astype("<i2").tobytes()
    native = NativeCodec()
    native.encode(update)
    (heard,) = native.decode(Frame(data=g711.encode(pcm, "pcma"))).inputs
    assert isinstance(heard, AudioIn) and heard.pcm == g711.decode(g711.encode(pcm, "pcma"), "pcma")
    assert native.encode_audio(pcm) == [g711.encode(pcm, "pcmu")]
    realtime = RealtimeCodec()
    realtime.encode(update)
    session = json.loads(realtime.encode(update)[0])["session"]
    assert session["audio"]["input"]["format"] == {"type": "audio/pcma"}
    assert session["audio"]["output"]["format"] == {"type": "audio/pcmu"}
    odd = base64.b64encode(g711.encode(pcm[:6], "pcma")).decode()  # 3 bytes: fine in G.711
    append = {"type": "input_audio_buffer.append", "audio": odd}
    (three,) = realtime.decode(Frame(text=json.dumps(append))).inputs
    assert isinstance(three, AudioIn) and len(three.pcm) == 6


def test_telephone_audio_reaches_the_vad_through_the_low_delay_resampler() -> None:
    resampler = to_vad_rate(8000)
    assert isinstance(resampler, PolyphaseResampler) and resampler.delay_ms < 5
