"""`voice-agent client` answers what a gateway does to a session (refuses it, drains, runs out
of quota, fails) and what the user asked for (`--out` where nothing can be written, Ctrl-C)
with one line and a non-zero status, never a traceback."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import websockets
from websockets.sync.server import Server, ServerConnection, serve

from services.client import stream
from services.client.stream import write_wav
from services.common.audio.pcm import float_to_pcm16
from services.ops.cli import main

CREATED = {
    "type": "session.created",
    "session": {"id": "s-42", "input_sample_rate": 16000, "output_sample_rate": 24000},
}


def _gateway(ws: ServerConnection, before: Callable[[], None]) -> None:
    """A gateway that does to the session what the path says, after one audio frame."""
    path = (ws.request.path if ws.request is not None else "").partition("?")[0]
    before()
    if path == "/busy":  # refused before session.created
        ws.close(1013, "retry after 5 s")
        return
    if path == "/draining":  # what a draining gateway answers a new session
        error = {
            "type": "error",
            "code": "capacity",
            "message": "gateway draining; retry after 1 s",
        }
        ws.send(json.dumps(error))
        ws.close(1013, "gateway draining")
        return
    ws.send(json.dumps(CREATED))
    ws.recv()
    if path == "/drain":
        ws.close(1012, "gateway draining: reconnect with ?session_id= to resume")
    elif path == "/quota":
        error = {"type": "error", "code": "quota_exceeded", "message": "daily audio used up"}
        ws.send(json.dumps(error))
        ws.close(1008, "daily audio quota used up")
    elif path == "/fail":
        ws.close(1011, "internal error")
    else:  # an answer, then the session goes on until the client closes it
        ws.send(json.dumps({"type": "response.created", "response_id": "r1"}))
        ws.send(b"\x00\x01" * 2400)
        ws.send(json.dumps({"type": "response.done", "response_id": "r1"}))
        try:
            while True:
                ws.recv()
        except websockets.ConnectionClosed:
            pass


class FakeGateway:
    def __init__(self) -> None:
        self.before: Callable[[], None] = lambda: None
        self.connections = 0
        self.server: Server | None = None

    def handler(self, ws: ServerConnection) -> None:
        self.connections += 1
        _gateway(ws, self.before)

    def url(self, path: str) -> str:
        assert self.server is not None
        return f"ws://127.0.0.1:{self.server.socket.getsockname()[1]}{path}"


@pytest.fixture
def gateway() -> Iterator[FakeGateway]:
    fake = FakeGateway()
    with serve(fake.handler, "127.0.0.1", 0) as server:
        fake.server = server
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        yield fake
        server.shutdown()
    thread.join()


@pytest.fixture
def wav(tmp_path: Path) -> Path:
    path = tmp_path / "question.wav"
    noise = np.random.default_rng(0).normal(0, 0.1, 3200).astype(np.float32)  # 0.2 s
    write_wav(path, float_to_pcm16(noise), 16000)
    return path


def client(
    wav: Path, url: str, out: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[int | str | None, str]:
    """Run `voice-agent client`; its exit status and its stderr."""
    with pytest.raises(SystemExit) as exited:
        main(["client", "--wav", str(wav), "--url", url, "--out", str(out), "--timeout", "5"])
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    return exited.value.code, err.strip()


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("/busy", "closed the connection (1013: retry after 5 s); the gateway is at capacity"),
        ("/draining", "refused the session: gateway draining; retry after 1 s"),
        ("/drain", "closed session s-42 (1012: gateway draining"),
        ("/quota", "closed session s-42 (1008: daily audio quota used up): a limit or quota"),
        ("/fail", "closed session s-42 (1011: internal error): the gateway failed (see its log)"),
    ],
)
def test_a_refused_or_ended_session_is_one_line(
    gateway: FakeGateway,
    wav: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    path: str,
    words: str,
) -> None:
    status, err = client(wav, gateway.url(path), tmp_path / "reply.wav", capsys)
    assert status == 1
    assert err.startswith("voice-agent client: error: the gateway ") and words in err, err
    if path == "/draining":  # its own words say why: no guess of ours after them
        assert err.endswith("retry after 1 s"), err


def test_a_drained_session_says_how_to_resume_it(
    gateway: FakeGateway, wav: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = gateway.url("/drain?lang=en")
    _, err = client(wav, url, tmp_path / "reply.wav", capsys)
    assert err.endswith(f"resume the session with --url '{url}&session_id=s-42'"), err


def test_out_is_checked_before_the_turn(
    gateway: FakeGateway, wav: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "missing" / "reply.wav"
    status, err = client(wav, gateway.url("/"), out, capsys)
    assert status == 2 and gateway.connections == 0
    assert err == f"voice-agent client: error: --out {out}: no folder {out.parent}"


def test_a_reply_that_cannot_be_written_blames_out(
    gateway: FakeGateway, wav: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "replies"
    folder.mkdir()
    gateway.before = lambda: shutil.rmtree(folder)  # gone by the time the reply is saved
    status, err = client(wav, gateway.url("/"), folder / "reply.wav", capsys)
    assert status == 1
    expected = f"voice-agent client: error: --out {folder / 'reply.wav'}: No such file or directory"
    assert err == expected


def test_ctrl_c_exits_130_without_a_traceback(
    wav: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def interrupted(*_: object) -> None:
        signal.raise_signal(signal.SIGINT)  # as Ctrl-C does: asyncio.run cancels the turn
        await asyncio.Event().wait()

    monkeypatch.setattr(stream, "talk", interrupted)
    # Ctrl-C as in a terminal, even where this test runs with SIGINT ignored (a background job)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        main(["client", "--wav", str(wav), "--out", str(tmp_path / "reply.wav")])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C came out as KeyboardInterrupt (a traceback)", pytrace=False)
    except SystemExit as exited:
        assert exited.code == 130
    else:
        pytest.fail("the command went on after Ctrl-C")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert "Traceback" not in capsys.readouterr().err
