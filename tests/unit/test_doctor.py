"""`voice-agent doctor`: each check against real and faked hosts, and the command itself."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.asr.settings import AsrSettings
from services.gateway import smart_turn
from services.gateway.settings import GatewaySection
from services.ops import deploy, doctor_checks
from services.ops.cli import main
from services.ops.deploy import NginxSite
from services.ops.doctor import load_env_file, report
from services.ops.doctor_checks import (
    Check,
    check_asr_model,
    check_end_of_turn,
    check_gpus,
    check_nginx_config,
    check_port,
    check_redis,
    check_tts_model,
)
from services.ops.redis_server import free_port
from services.tts.engines.chatterbox import REQUIRED_FILES
from services.tts.settings import TtsSettings
from tests.conftest import RedisProc
from tests.fake_nvml import FakeGpu, FakeNvml, nvml_installed, two_gpus
from tests.ops_app import ops_app
from tests.servers import ServerThread
from tests.tls import self_signed

needs_nginx = pytest.mark.skipif(deploy.nginx_binary() is None, reason="nginx is not installed")


def dual_gpu() -> tuple[AsrSettings, TtsSettings]:
    return AsrSettings(profile="dual-gpu"), TtsSettings(profile="dual-gpu")


def lite() -> tuple[AsrSettings, TtsSettings]:
    return AsrSettings(profile="lite"), TtsSettings(profile="lite")


@pytest.mark.parametrize(
    ("nvml", "settings", "status", "words"),
    [
        (two_gpus, dual_gpu, "OK", "2 GPU(s): 0 NVIDIA GeForce RTX 3090 (24.0 GiB), 1 NVIDIA RTX"),
        (lambda: FakeNvml([FakeGpu()]), dual_gpu, "FAIL", "tts wants GPU 1"),
        (lambda: None, dual_gpu, "FAIL", "asr, tts must run on CUDA"),
        (lambda: None, lite, "OK", "no GPU, and none needed"),
        (two_gpus, lite, "OK", "2 GPU(s)"),
    ],
)
def test_gpus(
    monkeypatch: pytest.MonkeyPatch, nvml: object, settings: object, status: str, words: str
) -> None:
    with nvml_installed(monkeypatch, nvml()):  # type: ignore[operator]
        check = check_gpus(*settings())  # type: ignore[operator]
    assert check.status == status and words in check.detail, check
    assert (check.fix != "") == (status == "FAIL")


def test_gpu_auto_without_gpu_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    asr = AsrSettings.model_validate({"asr": {"whisper": {"device": "auto"}}})
    with nvml_installed(monkeypatch, None):
        check = check_gpus(asr, TtsSettings())
    assert check.status == "WARN" and "asr will use the CPU" in check.detail


def test_embedded_engines_need_no_model_folder() -> None:
    assert check_asr_model(AsrSettings()).status == "OK"
    assert check_tts_model(TtsSettings()).status == "OK"


def test_doctor_passes_the_fake_engines() -> None:
    asr = check_asr_model(AsrSettings(profile="fake"))
    tts_check = check_tts_model(TtsSettings(profile="fake"))
    assert (asr.status, tts_check.status) == ("OK", "OK"), (asr, tts_check)


def test_whisper_model_folder(tmp_path: Path) -> None:
    settings = AsrSettings.model_validate(
        {"asr": {"whisper": {"model": "large-v3-turbo", "models_dir": str(tmp_path)}}}
    )
    missing = check_asr_model(settings)
    assert missing.status == "FAIL"
    assert "voice-agent models pull faster-whisper-large-v3-turbo --dir" in missing.fix
    folder = tmp_path / "faster-whisper-large-v3-turbo"
    folder.mkdir()
    (folder / "model.bin").write_bytes(b"x")
    no_tokenizer = check_asr_model(settings)
    assert no_tokenizer.status == "FAIL" and "tokenizer.json" in no_tokenizer.detail
    (folder / "tokenizer.json").write_text("{}")
    assert check_asr_model(settings).status == "OK"


def test_chatterbox_model_folder(tmp_path: Path) -> None:
    settings = TtsSettings.model_validate(
        {"tts": {"engine": "chatterbox", "chatterbox": {"models_dir": str(tmp_path)}}}
    )
    missing = check_tts_model(settings)
    assert missing.status == "FAIL" and "voice-agent models pull chatterbox" in missing.fix
    (tmp_path / "chatterbox").mkdir()
    for name in REQUIRED_FILES:
        (tmp_path / "chatterbox" / name).write_bytes(b"x")
    here = check_tts_model(settings)  # chatterbox lives in the TTS environment, not this one
    assert here.status == "WARN" and "--tts-venv" in here.fix
    elsewhere = check_tts_model(settings, tts_venv=tmp_path / "no-venv")
    assert elsewhere.status == "FAIL" and "not importable" in elsewhere.detail


def without_the_wheel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Smart Turn only where pulled: the tests extra installs its wheel, a GPU host has not."""
    monkeypatch.setattr(
        smart_turn, "available", lambda models_dir=None: (models_dir / "smart-turn-v3.2").is_dir()
    )


@pytest.mark.parametrize(
    ("policy", "pulled", "status", "words"),
    [
        ("auto", False, "WARN", "auto resolves to silence (slower turns): no Smart Turn model"),
        ("auto", True, "OK", "auto: Smart Turn"),
        ("smart-turn", False, "FAIL", "no Smart Turn model"),
        ("silence", False, "OK", "the silence policy"),
    ],
)
def test_end_of_turn(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    policy: str,
    pulled: bool,
    status: str,
    words: str,
) -> None:
    without_the_wheel(monkeypatch)
    if pulled:
        (tmp_path / "smart-turn-v3.2").mkdir()
    check = check_end_of_turn(GatewaySection(end_of_turn=policy, models_dir=tmp_path))
    assert check.status == status and words in check.detail, check
    if status != "OK":
        assert f"voice-agent models pull smart-turn --dir {tmp_path}" in check.fix


def test_end_of_turn_with_the_model_at_hand() -> None:
    assert check_end_of_turn(GatewaySection()).status == "OK"  # the tests extra's wheel


def test_redis(redis_server: RedisProc) -> None:
    up = check_redis(redis_server.url)
    assert up.status == "OK" and "Redis " in up.detail
    down = check_redis(f"redis://:hunter2@127.0.0.1:{free_port()}/0")
    assert down.status == "FAIL" and "hunter2" not in down.detail and ":***@" in down.detail
    in_query = check_redis(f"redis://u:p@127.0.0.1:{free_port()}/0?password=hunter2")
    assert in_query.status == "FAIL" and "hunter2" not in in_query.detail
    malformed = check_redis("redis://[::1")  # a FAIL that names it, not a ValueError
    assert malformed.status == "FAIL" and "VA_REDIS__URL" in malformed.detail


@pytest.fixture(scope="module")
def asr_service(redis_server: RedisProc) -> Iterator[ServerThread]:
    with ServerThread(ops_app("asr", redis_server.settings())) as server:
        yield server


def test_ports(asr_service: ServerThread) -> None:
    assert check_port("gateway", "127.0.0.1", free_port()).status == "OK"
    ours = check_port("asr", "0.0.0.0", asr_service.port)
    assert ours.status == "OK" and "serves voice-agent asr" in ours.detail
    assert check_port("tts", "127.0.0.1", asr_service.port).status == "FAIL"
    with socket.socket() as other:  # something that is not ours
        other.bind(("127.0.0.1", 0))
        other.listen()
        taken = check_port("gateway", "127.0.0.1", other.getsockname()[1])
    assert taken.status == "FAIL" and "VA_GATEWAY__SERVER__PORT" in taken.fix


@needs_nginx
def test_nginx(tmp_path: Path) -> None:
    site = NginxSite(tls_cert=tmp_path / "none.pem", tls_key=tmp_path / "none.key")
    no_cert = check_nginx_config(site)
    assert no_cert.status == "WARN" and "no certificate at" in no_cert.detail
    cert, key = self_signed(tmp_path)
    site = NginxSite(tls_cert=cert, tls_key=key)
    assert check_nginx_config(site).status == "OK"
    broken = tmp_path / "broken.conf"
    broken.write_text("events {}\nhttp { bogus_directive on; }\n")
    failed = check_nginx_config(site, broken)
    assert failed.status == "FAIL" and "bogus_directive" in failed.detail


def test_nginx_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor_checks, "nginx_binary", lambda: None)
    check = check_nginx_config(NginxSite())
    assert check.status == "WARN" and "apt-get install nginx" in check.fix


def test_env_file_fills_only_what_the_environment_lacks(tmp_path: Path) -> None:
    env_file = tmp_path / "va.env"
    env_file.write_text("# comment\nVA_PROFILE=dual-gpu\nVA_LOG_LEVEL='debug'\n\nnot a line\n")
    environ = {"VA_PROFILE": "lite"}
    load_env_file(env_file, environ)
    assert environ == {"VA_PROFILE": "lite", "VA_LOG_LEVEL": "debug"}


def test_report_lists_fixes_and_a_tally() -> None:
    text = report([Check("redis", "FAIL", "down", "start it"), Check("gpu", "OK", "none", "x")])
    assert text.splitlines() == [
        "FAIL  redis         down",
        "                    fix: start it",
        "OK    gpu           none",
        "1 FAIL, 0 WARN, 1 OK",
    ]


def isolate(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    """Set `env` for one test, and undo what the env file adds to the process environment."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for key in ("VA_LOG_LEVEL",):
        monkeypatch.setenv(key, "placeholder")
        monkeypatch.delenv(key)


def test_command_exits_non_zero_on_fail(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    isolate(monkeypatch, {"VA_REDIS__URL": f"redis://127.0.0.1:{free_port()}/0"})
    env_file = tmp_path / "va.env"
    env_file.write_text("VA_LOG_LEVEL=warning\n")
    with pytest.raises(SystemExit) as exited:
        main(["doctor", "--env-file", str(env_file), "--gateway-ports", "8000,8010"])
    out = capsys.readouterr().out
    assert exited.value.code == 1
    assert "FAIL  redis" in out and "fix: start Redis" in out
    assert out.count("port gateway") == 2


def test_command_warns_when_auto_would_be_silence(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    without_the_wheel(monkeypatch)
    isolate(
        monkeypatch,
        {
            "VA_REDIS__URL": f"redis://127.0.0.1:{free_port()}/0",
            "VA_GATEWAY__MODELS_DIR": str(tmp_path),
        },
    )
    with pytest.raises(SystemExit):
        main(["doctor", "--env-file", ""])
    out = capsys.readouterr().out
    assert "WARN  end of turn   auto resolves to silence" in out
    assert f"fix: voice-agent models pull smart-turn --dir {tmp_path}" in out


def test_command_passes_on_a_ready_host(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    redis_server: RedisProc,
    asr_service: ServerThread,
) -> None:
    isolate(
        monkeypatch,
        {
            "VA_REDIS__URL": redis_server.url,
            "VA_ASR__SERVER__PORT": str(asr_service.port),  # already serving: fine
            "VA_TTS__SERVER__PORT": str(free_port()),
            "VA_GATEWAY__SERVER__PORT": str(free_port()),
        },
    )
    main(["doctor", "--env-file", "", "--json"])  # returns: no FAIL
    out = capsys.readouterr().out
    assert '"status": "FAIL"' not in out and '"name": "redis"' in out
