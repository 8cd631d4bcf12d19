"""`voice-agent doctor` checks what `voice-agent up` would start with the same settings: the
duplex service (its engine, model and port) under VA_PROFILE=duplex, and every model the
ASR loads at start (`models.preload`), not only its default."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from services.asr.settings import AsrSettings
from services.duplex.settings import DuplexSettings
from services.ops import doctor_checks
from services.ops.doctor import Options, run_checks
from services.ops.doctor_checks import check_asr_model, check_duplex_model, check_gpus
from services.ops.models import MODELS
from services.ops.redis_server import free_port
from tests.fake_nvml import nvml_installed


@pytest.fixture
def duplex(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """VA_PROFILE=duplex with an empty models folder and no duplex environment; the
    folder."""
    monkeypatch.setenv("VA_PROFILE", "duplex")
    monkeypatch.setenv("VA_DUPLEX__MOSHI__MODELS_DIR", str(tmp_path))
    monkeypatch.setenv("VENV_DUPLEX", str(tmp_path / "no-venv"))
    monkeypatch.setenv("VA_REDIS__URL", f"redis://127.0.0.1:{free_port()}/0")
    for service in ("DUPLEX", "GATEWAY"):
        monkeypatch.setenv(f"VA_{service}__SERVER__PORT", str(free_port()))
    monkeypatch.delenv("VA_GATEWAY__BACKEND", raising=False)
    return tmp_path


def torch_and_moshi(monkeypatch: pytest.MonkeyPatch, installed: bool) -> None:
    real = doctor_checks._installed
    monkeypatch.setattr(
        doctor_checks,
        "_installed",
        lambda module: installed if module in ("torch", "moshi") else real(module),
    )


def test_duplex_profile_checks_the_duplex_service(
    duplex: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch_and_moshi(monkeypatch, True)
    with socket.socket() as other:  # something else on the duplex service's port
        other.bind(("127.0.0.1", 0))
        other.listen()
        monkeypatch.setenv("VA_DUPLEX__SERVER__PORT", str(other.getsockname()[1]))
        checks = {check.name: check for check in run_checks(Options())}
    assert "model asr" not in checks and "port tts" not in checks
    model = checks["model duplex"]
    assert model.status == "FAIL" and "missing model.safetensors" in model.detail, model
    assert model.fix == f"voice-agent models pull moshiko-pytorch-bf16 --dir {duplex}"
    assert checks["port duplex"].status == "FAIL"


def test_duplex_engine_must_be_importable(duplex: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch_and_moshi(monkeypatch, False)
    check = check_duplex_model(DuplexSettings())
    assert check.status == "FAIL" and "torch and moshi are not importable" in check.detail
    assert check.fix == "make install-duplex (docs/duplex.md)"


def test_a_complete_duplex_model_passes(duplex: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch_and_moshi(monkeypatch, True)
    folder = duplex / "moshiko-pytorch-bf16"
    folder.mkdir()
    for name in MODELS["moshiko-pytorch-bf16"].required():
        (folder / name).write_bytes(b"x")
    assert check_duplex_model(DuplexSettings()).status == "OK"
    monkeypatch.setenv("VA_DUPLEX__ENGINE", "fake")
    assert check_duplex_model(DuplexSettings()).status == "OK"


def test_duplex_on_cuda_needs_a_gpu(duplex: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with nvml_installed(monkeypatch, None):
        check = check_gpus(DuplexSettings())
    assert check.status == "FAIL" and "duplex must run on CUDA" in check.detail, check


def test_a_preloaded_model_without_its_folder_fails(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("VA_ASR__MODELS__PRELOAD", '["large-v3"]')
    monkeypatch.setenv("VA_ASR__WHISPER__MODELS_DIR", str(tmp_path))
    check = check_asr_model(AsrSettings())
    assert check.status == "FAIL", check
    assert check.fix == f"voice-agent models pull faster-whisper-large-v3 --dir {tmp_path}"
    folder = tmp_path / "faster-whisper-large-v3"
    folder.mkdir()
    (folder / "model.bin").write_bytes(b"x")
    (folder / "tokenizer.json").write_text("{}")
    passed = check_asr_model(AsrSettings())
    assert passed.status == "OK" and str(folder.absolute()) in passed.detail, passed
