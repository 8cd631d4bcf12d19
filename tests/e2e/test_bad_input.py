"""Bad input on every endpoint: docs/protocol.md's typed error, and a connection that still works.

Non-fatal errors are followed, on the same connection, by an operation that succeeds.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from websockets.asyncio.client import ClientConnection

from services.common.audio.pcm import encode_audio
from tests.conftest import Stack
from tests.e2e.wire import (
    Json,
    connect,
    pipelined,
    read_to_close,
    recall,
    recv_json,
    recv_until,
    send_json,
    send_to_close,
)
from tests.speech import speak, to_pcm16

SENTENCE = "what is the weather like in paris today"
HARD_CAP = 1 << 20  # the servers' ws_max_frame_bytes in tests/servers.py


SPEECH_16K = speak(SENTENCE, 16000)
"""Made at import, before any test runs: espeak-ng's klatt voice carries state from one
synthesis to the next in a process, so speech made on first use would depend on how much
the in-process TTS service had spoken before, and pocketsphinx's transcript with it."""
SPOKEN_PCM = to_pcm16(np.concatenate([np.zeros(4800, np.float32), SPEECH_16K]))
"""The sentence as PCM16 at 16 kHz, after 300 ms of silence."""


# ---------------------------------------------------------------- gateway /v1/stream

GATEWAY_NON_FATAL: list[tuple[str, str | bytes, str]] = [
    ("junk-json", "{not json", "invalid_message"),
    ("empty-text", "", "invalid_message"),
    ("json-array", "[1, 2, 3]", "invalid_message"),
    ("json-string", '"conversation.text"', "invalid_message"),
    ("json-null", "null", "invalid_message"),
    ("no-type", '{"text": "hi"}', "invalid_message"),
    ("type-not-string", '{"type": 7}', "invalid_message"),
    ("unknown-type", '{"type": "no.such.thing"}', "invalid_message"),
    ("text-missing", '{"type": "conversation.text"}', "invalid_message"),
    ("text-not-string", '{"type": "conversation.text", "text": 5}', "invalid_message"),
    ("text-empty", '{"type": "conversation.text", "text": ""}', "invalid_message"),
    ("text-blank", '{"type": "conversation.text", "text": " \\n\\t "}', "invalid_message"),
    ("create-empty", '{"type": "response.create", "text": ""}', "invalid_message"),
    ("create-blank", '{"type": "response.create", "text": "   "}', "invalid_message"),
    ("deep-json", "[" * 100_000, "invalid_message"),
    ("huge-int", '{"type": "response.create", "n": ' + "1" * 5000 + "}", "invalid_message"),
    ("nul-text", '{"type": "conversation.text", "text": "hi\\u0000"}', "invalid_message"),
    ("session-not-object", '{"type": "session.update", "session": "fast"}', "invalid_message"),
    (
        "unknown-agent",
        '{"type": "session.update", "session": {"agent": "nope"}}',
        "invalid_message",
    ),
    ("blank-voice", '{"type": "session.update", "session": {"voice": "  "}}', "invalid_message"),
    (
        "empty-language",
        '{"type": "session.update", "session": {"language": ""}}',
        "invalid_message",
    ),
    ("odd-pcm", bytes(321), "invalid_audio"),
    ("empty-pcm", b"", "invalid_audio"),
    (
        "input-rate",
        '{"type": "session.update", "session": {"input_sample_rate": 44100}}',
        "unsupported_sample_rate",
    ),
    (
        "output-rate",
        '{"type": "session.update", "session": {"output_sample_rate": 22050}}',
        "unsupported_sample_rate",
    ),
]


async def _session(ws: ClientConnection) -> Json:
    created = await recv_json(ws)
    assert created["type"] == "session.created", created
    session: Json = created["session"]
    return session


async def _assert_responds(ws: ClientConnection, text: str = "ok") -> bytes:
    """A `conversation.text` turn completes on this connection; no error comes first."""
    await send_json(ws, {"type": "conversation.text", "text": text})
    done, before, audio = await recv_until(ws, "response.done", timeout_s=20)
    assert done["status"] == "completed" and done["text"] == text, done
    assert not [e for e in before if e["type"] == "error"], before
    assert audio
    return audio


@pytest.mark.parametrize(
    ("frame", "code"), [c[1:] for c in GATEWAY_NON_FATAL], ids=[c[0] for c in GATEWAY_NON_FATAL]
)
async def test_gateway_bad_message_costs_an_error_not_the_session(
    lite_stack: Stack, frame: str | bytes, code: str
) -> None:
    async with connect(lite_stack.stream_url) as ws:
        session = await _session(ws)
        await ws.send(frame)
        error = await recv_json(ws)
        assert error["type"] == "error", error
        assert error["code"] == code and error["fatal"] is False, error
        assert error["message"]
        await _assert_responds(ws)
        # A refused session.update changed nothing.
        await send_json(ws, {"type": "session.update", "session": {}})
        updated = await recv_json(ws)
        assert updated == {"type": "session.updated", "session": session}


async def test_gateway_many_errors_in_a_row_then_a_spoken_turn(lite_stack: Stack) -> None:
    async with connect(lite_stack.stream_url) as ws:
        await _session(ws)
        for _, frame, _ in GATEWAY_NON_FATAL:
            await ws.send(frame)
        codes = [(await recv_json(ws))["code"] for _ in GATEWAY_NON_FATAL]
        assert codes == [c[2] for c in GATEWAY_NON_FATAL]
        pcm = SPOKEN_PCM
        for offset in range(0, len(pcm), 640):
            await ws.send(pcm[offset : offset + 640])
        await send_json(ws, {"type": "input_audio.commit"})
        final, _, _ = await recv_until(ws, "transcript.final", timeout_s=20)
        assert recall(SENTENCE, final["text"]) >= 0.6, final
        done, _, _ = await recv_until(ws, "response.done", timeout_s=20)
        assert done["status"] == "completed"


async def test_gateway_unknown_voice_is_reported_as_the_clients_mistake(lite_stack: Stack) -> None:
    async with connect(lite_stack.stream_url) as ws:
        await _session(ws)
        await send_json(ws, {"type": "session.update", "session": {"voice": "no-such-voice"}})
        assert (await recv_json(ws))["type"] == "session.updated"
        await send_json(ws, {"type": "conversation.text", "text": "ok"})
        done, before, _ = await recv_until(ws, "response.done", timeout_s=20)
        errors = [e for e in before if e["type"] == "error"]
        assert done["status"] == "failed"
        assert [(e["code"], e["fatal"]) for e in errors] == [("invalid_message", False)], errors
        assert "no-such-voice" in errors[0]["message"]
        await send_json(ws, {"type": "session.update", "session": {"voice": "default"}})
        assert (await recv_json(ws))["type"] == "session.updated"
        await _assert_responds(ws)


@pytest.mark.parametrize(
    ("query", "code"),
    [("?session_id=" + "x" * 65, "invalid_message"), ("?session_id=", None)],
    ids=["session-id-too-long", "empty-session-id"],
)
async def test_gateway_bad_query(lite_stack: Stack, query: str, code: str | None) -> None:
    async with connect(lite_stack.stream_url + query) as ws:
        if code is None:  # harmless: a fresh session
            await _session(ws)
            await _assert_responds(ws)
            return
        events, close_code = await read_to_close(ws)
    assert close_code == 1008
    assert [(e["type"], e["code"], e["fatal"]) for e in events] == [("error", code, True)]
    assert "session_id" in events[0]["message"]


@pytest.mark.parametrize(
    ("input_rate", "size", "closed"),
    [
        (16000, 32000, False),  # exactly 1 s: allowed
        (16000, 32002, True),
        (8000, 16000, False),
        (8000, 16002, True),
        (48000, 96002, True),
    ],
)
async def test_gateway_frame_over_one_second_closes_1009(
    lite_stack: Stack, input_rate: int, size: int, closed: bool
) -> None:
    async with connect(lite_stack.stream_url) as ws:
        await _session(ws)
        if input_rate != 16000:
            await send_json(
                ws, {"type": "session.update", "session": {"input_sample_rate": input_rate}}
            )
            assert (await recv_json(ws))["type"] == "session.updated"
        await ws.send(bytes(size))
        if not closed:
            await _assert_responds(ws)
            return
        events, code = await read_to_close(ws)
    assert code == 1009
    assert [(e["type"], e["code"], e["fatal"]) for e in events] == [
        ("error", "invalid_audio", True)
    ]


async def test_gateway_frame_over_hard_cap_closes_1009(lite_stack: Stack) -> None:
    async with connect(lite_stack.stream_url) as ws:
        await _session(ws)
        _, code = await send_to_close(ws, bytes(HARD_CAP + 2))
    assert code == 1009


async def test_gateway_text_over_hard_cap_closes_1009(lite_stack: Stack) -> None:
    async with connect(lite_stack.stream_url) as ws:
        await _session(ws)
        text = json.dumps({"type": "conversation.text", "text": "a" * HARD_CAP})
        _, code = await send_to_close(ws, text)
    assert code == 1009


@pytest.mark.parametrize(
    ("server", "path"),
    [("gateway", "/v1/stream"), ("asr", "/v1/stream/asr"), ("tts", "/v1/stream/tts")],
)
def test_bad_first_message_sent_with_the_handshake(
    lite_stack: Stack, server: str, path: str
) -> None:
    """A client that does not wait for the 101 still gets its error, not silence."""
    received = pipelined(lite_stack.servers[server].port, path, b"{{", until=b"invalid_message")
    assert received.startswith(b"HTTP/1.1 101 ")
    assert b'"code":"invalid_message"' in received


# ---------------------------------------------------------------- ASR /v1/stream/asr


def _asr_url(stack: Stack, query: str = "") -> str:
    return f"{stack.asr.ws}/v1/stream/asr{query}"


async def _assert_transcribes(ws: ClientConnection) -> None:
    """Speech then `commit` yields a final with the words, on this connection."""
    pcm = SPOKEN_PCM
    for offset in range(0, len(pcm), 16000):
        await ws.send(pcm[offset : offset + 16000])
    await send_json(ws, {"type": "commit"})
    final, before, _ = await recv_until(ws, "transcript.final", timeout_s=20)
    assert not [e for e in before if e["type"] == "error"], before
    assert recall(SENTENCE, final["text"]) >= 0.6, final


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ("?sample_rate=44100", "unsupported_sample_rate"),
        ("?sample_rate=0", "unsupported_sample_rate"),
        ("?sample_rate=abc", "unsupported_sample_rate"),
        ("?partials=perhaps", "invalid_message"),
        ("?language=" + "x" * 17, "invalid_message"),
    ],
)
async def test_asr_bad_query(lite_stack: Stack, query: str, code: str) -> None:
    """A stream that cannot start still says why, as a typed error, before closing 1008."""
    async with connect(_asr_url(lite_stack, query)) as ws:
        events, close_code = await read_to_close(ws)
    assert close_code == 1008
    assert [(e["type"], e["code"], e["fatal"]) for e in events] == [("error", code, True)], events
    if code == "unsupported_sample_rate":
        assert "use one of 8000, 16000, 24000, 48000" in events[0]["message"]


ASR_NON_FATAL: list[tuple[str, str | bytes, str]] = [
    ("junk-json", "{not json", "invalid_message"),
    ("brace-brace", "{{", "invalid_message"),
    ("empty-text", "", "invalid_message"),
    ("json-null", "null", "invalid_message"),
    ("json-array", "[]", "invalid_message"),
    ("type-not-string", '{"type": 1}', "invalid_message"),
    ("deep-json", "[" * 100_000, "invalid_message"),
    ("huge-int", '{"type": "commit", "n": ' + "1" * 5000 + "}", "invalid_message"),
    ("unknown-type", '{"type": "speak", "text": "hi"}', "invalid_message"),
    ("odd-pcm", bytes(321), "invalid_audio"),
    ("empty-pcm", b"", "invalid_audio"),
]


@pytest.mark.parametrize(
    ("frame", "code"), [c[1:] for c in ASR_NON_FATAL], ids=[c[0] for c in ASR_NON_FATAL]
)
async def test_asr_bad_frame_costs_an_error_not_the_stream(
    lite_stack: Stack, frame: str | bytes, code: str
) -> None:
    async with connect(_asr_url(lite_stack)) as ws:
        assert await recv_json(ws) == {"type": "ready", "sample_rate": 16000}
        await ws.send(frame)
        error = await recv_json(ws)
        assert (error["type"], error["code"], error["fatal"]) == ("error", code, False), error
        await _assert_transcribes(ws)


@pytest.mark.parametrize("query", ["?language=", "?language=en&partials=false", "?partials=0"])
async def test_asr_harmless_query(lite_stack: Stack, query: str) -> None:
    """An empty `language` is no language (as on the REST door), not an engine's puzzle."""
    async with connect(_asr_url(lite_stack, query)) as ws:
        assert await recv_json(ws) == {"type": "ready", "sample_rate": 16000}
        await _assert_transcribes(ws)


def _assert_empty_final(event: Json) -> None:
    assert event["type"] == "transcript.final" and event["text"] == "", event
    assert event["segment_id"].startswith("seg_") and event["start_ms"] == event["end_ms"]


@pytest.mark.parametrize("silence_ms", [0, 500])
async def test_asr_commit_with_nothing_heard_gets_an_empty_final(
    lite_stack: Stack, silence_ms: int
) -> None:
    """A client that commits and waits for its final never waits forever."""
    async with connect(_asr_url(lite_stack)) as ws:
        assert (await recv_json(ws))["type"] == "ready"
        if silence_ms:
            await ws.send(bytes(32 * silence_ms))
        await send_json(ws, {"type": "commit"})
        final = await recv_json(ws)
        _assert_empty_final(final)
        assert final["end_ms"] == silence_ms
        await _assert_transcribes(ws)


async def test_asr_commit_after_the_vad_ended_the_segment_comes_after_its_final(
    lite_stack: Stack,
) -> None:
    """Push-to-talk released after a pause: the VAD already ended the segment; the commit's
    empty final follows the segment's own (finals go out in segment order)."""
    async with connect(_asr_url(lite_stack)) as ws:
        assert (await recv_json(ws))["type"] == "ready"
        for offset in range(0, len(SPOKEN_PCM), 16000):
            await ws.send(SPOKEN_PCM[offset : offset + 16000])
        await ws.send(bytes(32 * 900))  # the VAD ends the segment in this frame's silence
        await send_json(ws, {"type": "commit"})  # while its final is being transcribed
        first, before, _ = await recv_until(ws, "transcript.final", timeout_s=20)
        assert not [e for e in before if e["type"] == "error"], before
        assert recall(SENTENCE, first["text"]) >= 0.6, first
        _assert_empty_final(await recv_json(ws, timeout_s=20))


@pytest.mark.parametrize(
    ("query", "size"), [("", 32002), ("?sample_rate=8000", 16002), ("", HARD_CAP + 2)]
)
async def test_asr_oversize_frame_closes_1009(lite_stack: Stack, query: str, size: int) -> None:
    async with connect(_asr_url(lite_stack, query)) as ws:
        assert (await recv_json(ws))["type"] == "ready"
        events, code = await send_to_close(ws, bytes(size))
    assert code == 1009
    if size < HARD_CAP:
        assert [(e["type"], e["code"], e["fatal"]) for e in events] == [
            ("error", "invalid_audio", True)
        ]


# ---------------------------------------------------------------- TTS /v1/stream/tts


def _tts_url(stack: Stack) -> str:
    return f"{stack.tts.ws}/v1/stream/tts"


async def _assert_speaks(ws: ClientConnection, request_id: str = "after") -> None:
    await send_json(ws, {"type": "speak", "id": request_id, "text": "ok"})
    start = await recv_json(ws)
    assert start["type"] == "audio.start" and start["id"] == request_id, start
    done, before, audio = await recv_until(ws, "audio.done")
    assert not before, before
    assert (done["id"], done["status"]) == (request_id, "completed")
    assert audio and abs(len(audio) / 2 / start["sample_rate"] * 1000 - done["audio_ms"]) <= 1


TTS_NON_FATAL: list[tuple[str, str | bytes, str, str | None]] = [
    ("junk-json", "{not json", "invalid_message", None),
    ("binary", bytes(320), "invalid_message", None),
    ("unknown-type", '{"type": "commit"}', "invalid_message", None),
    ("speak-no-id", '{"type": "speak", "text": "hi"}', "invalid_message", None),
    ("speak-no-text", '{"type": "speak", "id": "r1"}', "invalid_message", "r1"),
    ("speak-empty-text", '{"type": "speak", "id": "e", "text": ""}', "invalid_message", "e"),
    ("speak-blank-text", '{"type": "speak", "id": "e2", "text": " \\n "}', "invalid_message", "e2"),
    (
        "speak-long-id",
        json.dumps({"type": "speak", "id": "x" * 129, "text": "hi"}),
        "invalid_message",
        None,
    ),
    ("cancel-empty-id", '{"type": "cancel", "id": ""}', "invalid_message", None),
    ("cancel-long-id", json.dumps({"type": "cancel", "id": "x" * 129}), "invalid_message", None),
    ("deep-json", "[" * 100_000, "invalid_message", None),
    ("huge-int", '{"type": "speak", "n": ' + "1" * 5000 + "}", "invalid_message", None),
    ("nul-text", '{"type": "speak", "id": "n", "text": "a\\u0000b"}', "invalid_message", "n"),
    (
        "unknown-voice",
        '{"type": "speak", "id": "r2", "text": "hi", "voice": "no-such-voice"}',
        "invalid_message",
        "r2",
    ),
    (
        "unknown-library-voice",
        '{"type": "speak", "id": "r5", "text": "hi", "voice": "v_0000000000000000"}',
        "invalid_message",
        "r5",
    ),
    (
        "bad-rate",
        '{"type": "speak", "id": "r3", "text": "hi", "sample_rate": 44100}',
        "unsupported_sample_rate",
        "r3",
    ),
    (
        "bad-speed",
        '{"type": "speak", "id": "r4", "text": "hi", "speed": 0}',
        "invalid_message",
        "r4",
    ),
]


@pytest.mark.parametrize(
    ("frame", "code", "request_id"),
    [c[1:] for c in TTS_NON_FATAL],
    ids=[c[0] for c in TTS_NON_FATAL],
)
async def test_tts_bad_frame_costs_an_error_not_the_stream(
    lite_stack: Stack, frame: str | bytes, code: str, request_id: str | None
) -> None:
    async with connect(_tts_url(lite_stack)) as ws:
        assert await recv_json(ws) == {"type": "ready"}
        await ws.send(frame)
        error = await recv_json(ws)
        assert (error["type"], error["code"], error["fatal"]) == ("error", code, False), error
        assert error.get("id") == request_id, error
        if request_id == "r2":
            assert "no-such-voice" in error["message"]
        await _assert_speaks(ws)


async def test_tts_speak_then_cancel(lite_stack: Stack) -> None:
    text = " ".join(["this sentence is long enough to be cancelled before its end."] * 40)
    async with connect(_tts_url(lite_stack)) as ws:
        assert await recv_json(ws) == {"type": "ready"}
        await send_json(ws, {"type": "speak", "id": "long", "text": text})
        await send_json(ws, {"type": "cancel", "id": "long"})
        done, before, _ = await recv_until(ws, "audio.done")
        assert [e["type"] for e in before] == ["audio.start"]
        assert (done["id"], done["status"]) == ("long", "cancelled")
        assert done["audio_ms"] < 60_000  # the whole text is several minutes of speech
        await send_json(ws, {"type": "cancel", "id": "never-sent"})  # harmless
        await _assert_speaks(ws)


async def test_tts_burst_every_request_answered(lite_stack: Stack) -> None:
    """More requests than the per-connection queue holds: each is served or refused by id,
    and a refusal is not fatal (the connection goes on)."""
    ids = [f"b{i}" for i in range(45)]
    async with connect(_tts_url(lite_stack)) as ws:
        assert await recv_json(ws) == {"type": "ready"}
        for request_id in ids:
            await send_json(ws, {"type": "speak", "id": request_id, "text": "hi"})
        answered: dict[str, str] = {}
        while len(answered) < len(ids):
            event = await recv_json(ws)
            if event["type"] == "error":
                assert (event["code"], event["fatal"]) == ("capacity", False), event
                answered[event["id"]] = "refused"
            elif event["type"] == "audio.done":
                answered[event["id"]] = event["status"]
        assert sorted(answered) == sorted(ids)
        assert list(answered.values()).count("completed") >= 32
        await _assert_speaks(ws)


async def test_tts_oversize_text_frame_closes_1009(lite_stack: Stack) -> None:
    async with connect(_tts_url(lite_stack)) as ws:
        assert await recv_json(ws) == {"type": "ready"}
        speak_big = {"type": "speak", "id": "big", "text": "a" * HARD_CAP}
        _, code = await send_to_close(ws, json.dumps(speak_big))
    assert code == 1009


# ---------------------------------------------------------------- REST


def _error(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, (response.status_code, response.text)
    error = response.json()["error"]
    assert error["code"] == code and error["type"] == code, error
    message: str = error["message"]
    assert message
    return message


@pytest.fixture(scope="module")
def asr_http(lite_stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=lite_stack.asr.http, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def tts_http(lite_stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=lite_stack.tts.http, timeout=60) as client:
        yield client


def _transcribe(
    client: httpx.Client, data: bytes, name: str = "a.wav", **form: str
) -> httpx.Response:
    return client.post(
        "/v1/audio/transcriptions",
        files={"file": (name, data, "application/octet-stream")},
        data={"model": "whisper-1", **form},
    )


def test_rest_transcription_empty_upload(asr_http: httpx.Client) -> None:
    assert "empty" in _error(_transcribe(asr_http, b""), 400, "invalid_audio")


@pytest.mark.parametrize(
    "data",
    [
        b"hello, this is a text file and not audio at all\n" * 20,
        bytes(range(256)) * 64,
        b"RIFF\x24\x00\x00\x00WAVEfmt ",  # a truncated wav header
        json.dumps({"text": "hi"}).encode(),
    ],
    ids=["text", "binary", "truncated-wav", "json"],
)
def test_rest_transcription_not_audio(asr_http: httpx.Client, data: bytes) -> None:
    _error(_transcribe(asr_http, data, name="notes.txt"), 400, "invalid_audio")


def test_rest_transcription_bad_response_format(asr_http: httpx.Client) -> None:
    wav = encode_audio(SPEECH_16K[:1600], 16000, "wav")
    message = _error(_transcribe(asr_http, wav, response_format="docx"), 400, "invalid_message")
    assert "docx" in message


@pytest.mark.parametrize(
    ("form", "needle"),
    [
        ({"temperature": "warm"}, "temperature"),
        ({"temperature": "nan"}, "temperature"),
        ({"temperature": "inf"}, "temperature"),
        ({"temperature": "1.5"}, "temperature"),
        ({"temperature": "-0.1"}, "temperature"),
        ({"language": "x" * 17}, "language"),
    ],
    ids=[
        "temperature-text",
        "temperature-nan",
        "temperature-inf",
        "temperature-high",
        "temperature-low",
        "long-language",
    ],
)
def test_rest_transcription_bad_form(
    asr_http: httpx.Client, form: dict[str, str], needle: str
) -> None:
    wav = encode_audio(SPEECH_16K[:1600], 16000, "wav")
    assert needle in _error(_transcribe(asr_http, wav, **form), 400, "invalid_message")


def test_rest_transcription_missing_file(asr_http: httpx.Client) -> None:
    response = asr_http.post("/v1/audio/transcriptions", data={"model": "whisper-1"})
    assert "file" in _error(response, 400, "invalid_message")
    response = asr_http.post("/v1/audio/transcriptions", json={"model": "whisper-1"})
    assert "file" in _error(response, 400, "invalid_message")


def test_rest_transcription_over_limit(asr_http: httpx.Client) -> None:
    too_big = bytes(25 * 1024 * 1024 + 1)  # the default max_upload_mb is 25
    assert "exceeds" in _error(_transcribe(asr_http, too_big), 413, "invalid_audio")
    assert asr_http.get("/ready").status_code == 200


async def test_rest_upload_declared_past_the_limit_is_refused_before_its_body(
    lite_stack: Stack,
) -> None:
    """A Content-Length past the limit gets its 413 at once: no byte of the body is read."""
    where = httpx.URL(lite_stack.asr.http)
    reader, writer = await asyncio.open_connection(where.host, where.port)
    head = (
        "POST /v1/audio/transcriptions HTTP/1.1\r\nHost: asr\r\n"
        "Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 10000000000\r\n\r\n"
    )
    writer.write(head.encode())
    await writer.drain()
    status = await asyncio.wait_for(reader.readline(), 10)
    writer.close()
    assert status.split()[1] == b"413", status


def test_rest_upload_sent_chunked_is_refused_once_past_the_limit(asr_http: httpx.Client) -> None:
    """Sent chunked (no Content-Length), it is refused with the same typed 413 once past the
    limit (the rest is discarded as the client sends it, not spooled to disk: not
    observable here; the declared case above shows the refusal comes first)."""

    def body() -> Iterator[bytes]:
        yield b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
        for _ in range(30):  # 30 MB: past the default 25 MB
            yield bytes(1024 * 1024)

    headers = {"content-type": "multipart/form-data; boundary=b"}
    try:
        response = asr_http.post("/v1/audio/transcriptions", content=body(), headers=headers)
    except httpx.TransportError:  # the server answered and closed while we still sent
        pass
    else:
        assert "exceeds" in _error(response, 413, "invalid_audio")
    assert asr_http.get("/ready").status_code == 200


def test_rest_transcription_still_works(asr_http: httpx.Client) -> None:
    wav = encode_audio(SPEECH_16K, 16000, "wav")
    response = _transcribe(asr_http, wav)
    assert response.status_code == 200
    assert recall(SENTENCE, response.json()["text"]) >= 0.6


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"model": "tts-1", "voice": "alloy", "input": ""}, "input"),
        ({"model": "tts-1", "voice": "alloy", "input": " \n\t "}, "input"),
        ({"model": "tts-1", "voice": "alloy"}, "input"),
        ({"model": "tts-1", "voice": "no-such-voice", "input": "hi"}, "no-such-voice"),
        ({"model": "tts-1", "voice": "alloy", "input": "hi", "response_format": "ogg"}, "ogg"),
        ({"model": "tts-1", "voice": "alloy", "input": "hi", "speed": 9}, "speed"),
        ({"model": "tts-1", "voice": "alloy", "input": "a" * 5000}, "4096"),
        ({"model": "tts-1", "voice": "alloy", "input": "hi", "sample_rate": 1}, "sample_rate"),
        ({"model": "tts-1", "voice": "alloy", "input": "hi\u0000 there"}, "control characters"),
    ],
    ids=[
        "empty-input",
        "blank-input",
        "no-input",
        "unknown-voice",
        "bad-format",
        "bad-speed",
        "too-long",
        "rate",
        "nul-input",
    ],
)
def test_rest_speech_bad_body(tts_http: httpx.Client, body: Json, needle: str) -> None:
    message = _error(tts_http.post("/v1/audio/speech", json=body), 400, "invalid_message")
    assert needle in message


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"[1, 2]", b"", b"null", b"[" * 100_000],
    ids=["junk", "array", "empty", "null", "deep"],
)
def test_rest_speech_bad_json(tts_http: httpx.Client, content: bytes) -> None:
    response = tts_http.post(
        "/v1/audio/speech", content=content, headers={"content-type": "application/json"}
    )
    _error(response, 400, "invalid_message")


def test_rest_speech_still_works(tts_http: httpx.Client) -> None:
    body = {"model": "tts-1", "voice": "alloy", "input": "ok", "response_format": "wav"}
    response = tts_http.post("/v1/audio/speech", json=body)
    assert response.status_code == 200 and response.content[:4] == b"RIFF"


@pytest.mark.parametrize(
    ("form", "needle"),
    [
        ({}, "name"),
        ({"name": " \n "}, "name"),
        ({"name": "x" * 65}, "name"),
        ({"name": "Ada", "espeak_voice": "not a voice!"}, "espeak_voice"),
    ],
    ids=["no-name", "blank-name", "long-name", "bad-stand-in"],
)
def test_rest_voice_upload_bad_form(
    tts_http: httpx.Client, form: dict[str, str], needle: str
) -> None:
    clip = encode_audio(SPEECH_16K, 16000, "wav")
    files = {"file": ("clip.wav", clip, "audio/wav")}
    assert needle in _error(
        tts_http.post("/v1/voices", files=files, data=form), 400, "invalid_message"
    )


@pytest.mark.parametrize(
    "data",
    [b"", b"RIFF\x24\x00\x00\x00WAVEfmt ", b"text, not audio\n" * 50],
    ids=["empty", "wav-header", "text"],
)
def test_rest_voice_upload_not_audio(tts_http: httpx.Client, data: bytes) -> None:
    files = {"file": ("clip.wav", data, "audio/wav")}
    _error(tts_http.post("/v1/voices", files=files, data={"name": "Ada"}), 400, "invalid_audio")


def test_rest_voice_upload_without_file(tts_http: httpx.Client) -> None:
    assert "file" in _error(
        tts_http.post("/v1/voices", data={"name": "Ada"}), 400, "invalid_message"
    )
    assert "file" in _error(
        tts_http.post("/v1/voices", json={"name": "Ada"}), 400, "invalid_message"
    )


@pytest.mark.parametrize("voice_id", ["v_0000000000000000", "default", "nope", "%20"])
def test_rest_delete_unknown_voice_is_a_json_404(tts_http: httpx.Client, voice_id: str) -> None:
    _error(tts_http.delete(f"/v1/voices/{voice_id}"), 404, "invalid_message")


@pytest.mark.parametrize("service", ["asr", "tts", "gateway"])
@pytest.mark.parametrize("window", ["abc", "nan", "inf", "-inf", "0", "-1", "601", ""])
def test_rest_health_bad_window(lite_stack: Stack, service: str, window: str) -> None:
    response = httpx.get(f"{lite_stack.servers[service].http}/health?window_s={window}")
    assert "window_s" in _error(response, 400, "invalid_message")


@pytest.mark.parametrize(
    ("service", "method", "path", "status"),
    [
        ("asr", "GET", "/v1/audio/transcriptions", 405),
        ("asr", "GET", "/v1/audio/translations", 405),
        ("asr", "GET", "/v1/audio/nothing-here", 404),
        ("tts", "GET", "/v1/audio/speech", 405),
        ("tts", "DELETE", "/v1/voices", 405),
        ("tts", "PUT", "/v1/voices/v_0000000000000000", 405),
        ("gateway", "GET", "/v1/nothing-here", 404),
        ("gateway", "POST", "/health", 405),
    ],
)
def test_rest_unknown_route_or_method_is_a_json_error(
    lite_stack: Stack, service: str, method: str, path: str, status: int
) -> None:
    response = httpx.request(method, lite_stack.servers[service].http + path)
    _error(response, status, "invalid_message")
    if status == 405:
        assert response.headers["allow"]
