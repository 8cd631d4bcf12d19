"""`voice-agent healthcheck` (the images' HEALTHCHECK): which service, which URL, what exit."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from services.asr.settings import AsrSettings
from services.duplex.settings import DuplexSettings
from services.ops.healthcheck import HealthcheckError, add_parser, command_of, run, targets
from services.tts.settings import TtsSettings
from tests.servers import ServerThread


@pytest.mark.parametrize(
    ("argv", "found"),
    [
        (["/opt/venv/bin/python", "/opt/venv/bin/voice-agent", "asr"], ("asr", [])),
        (["voice-agent", "gateway", "--port", "9000"], ("gateway", ["--port", "9000"])),
        (["/run/podman-init", "--", "voice-agent", "tts"], ("tts", [])),
        (["python", "-m", "services.tts.server", "--port=7"], ("tts", ["--port=7"])),
        (["python3", "services/asr/server.py"], ("asr", [])),
        (["voice-agent", "up"], ("up", [])),
    ],
)
def test_the_service_is_read_from_the_command_line(
    argv: list[str], found: tuple[str, list[str]]
) -> None:
    assert command_of(argv) == found


def test_a_command_line_without_a_service_names_only_its_program() -> None:
    with pytest.raises(HealthcheckError) as raised:
        command_of(["/usr/bin/sleep", "--token=SECRET", "asr"])
    assert "sleep" in str(raised.value) and "SECRET" not in str(raised.value)


def test_urls_come_from_the_arguments_then_the_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cmdline = tmp_path / "cmdline"
    cmdline.write_bytes(b"voice-agent\0gateway\0--port\x009100\0")
    assert targets(None, None, cmdline) == ["http://127.0.0.1:9100/ready"]
    monkeypatch.setenv("VA_TTS__SERVER__HOST", "0.0.0.0")
    cmdline.write_bytes(b"catatonit\0--\0voice-agent\0tts\0")
    assert targets(None, None, cmdline) == ["http://127.0.0.1:8002/ready"]
    monkeypatch.setenv("VA_ASR__SERVER__PORT", "9201")
    assert targets("asr", None, cmdline) == ["http://127.0.0.1:9201/ready"]
    assert targets("up", None, cmdline) == [
        "http://127.0.0.1:9201/ready",
        "http://127.0.0.1:8002/ready",
        "http://127.0.0.1:8000/ready",
    ]
    assert targets(None, "http://h:1/", cmdline) == ["http://h:1/ready"]
    with pytest.raises(HealthcheckError):
        targets(None, None, tmp_path / "missing")
    monkeypatch.setenv("VA_PROFILE", "duplex")  # `up` runs the duplex service and a gateway
    assert targets("up", None, cmdline) == [
        "http://127.0.0.1:8003/ready",
        "http://127.0.0.1:8000/ready",
    ]


def test_setting_only_the_host_keeps_each_service_s_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """The images set VA_ASR__SERVER__HOST=0.0.0.0 alone; the ports must stay 8001 and 8002."""
    monkeypatch.setenv("VA_ASR__SERVER__HOST", "0.0.0.0")
    monkeypatch.setenv("VA_TTS__SERVER__HOST", "0.0.0.0")
    monkeypatch.setenv("VA_DUPLEX__SERVER__HOST", "0.0.0.0")
    assert AsrSettings().asr.server.port == 8001
    assert TtsSettings().tts.server.port == 8002
    assert DuplexSettings().duplex.server.port == 8003


def _args(*argv: str) -> argparse.Namespace:
    return add_parser(argparse.ArgumentParser()).parse_args(list(argv))


def test_exit_status_follows_ready(capsys: pytest.CaptureFixture[str]) -> None:
    from fastapi import FastAPI, Response

    app = FastAPI()
    state = {"ready": False}

    @app.get("/ready")
    def ready() -> Response:
        return Response(status_code=200 if state["ready"] else 503)

    with ServerThread(app) as server:
        assert run(_args("--url", server.http)) == 1
        assert "HTTP 503" in capsys.readouterr().err
        state["ready"] = True
        assert run(_args("--url", server.http, "--service", "gateway")) == 0
    assert run(_args("--url", "file:///etc/passwd")) == 1
    assert run(_args("--url", server.http, "--timeout", "1")) == 1  # stopped: refused
