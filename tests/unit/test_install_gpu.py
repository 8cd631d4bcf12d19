"""scripts/install_gpu.sh: valid bash, and the dry run shows the two environments' recipe."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "install_gpu.sh"


def dry_run(*args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VENV": "/nonexistent/venv", "VENV_TTS": "/nonexistent/venv-tts"}
    if path is not None:
        env["PATH"] = path
    return subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=30,
        check=False,
    )


def commands(output: str) -> list[str]:
    """The commands the dry run printed, unquoted (as the shell would run them)."""
    lines = [line[2:] for line in output.splitlines() if line.startswith("+ ")]
    return [" ".join(shlex.split(line)) for line in lines]


def test_script_is_valid_bash() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True, timeout=30)


def test_make_target_calls_the_script() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "install-gpu:\n\tMODELS_DIR=$(MODELS) bash scripts/install_gpu.sh" in makefile


@pytest.mark.parametrize(
    ("args", "folder"),
    [
        ((), "models"),
        (("--models-dir", "/var/lib/voice-agent/models"), "/var/lib/voice-agent/models"),
    ],
)
def test_the_gateways_smart_turn_model_is_pulled(args: tuple[str, ...], folder: str) -> None:
    """Without Smart Turn the default end-of-turn policy `auto` is the slower silence rule."""
    done = dry_run("--cuda", "cu126", *args)
    assert done.returncode == 0, done.stderr
    assert f"/nonexistent/venv/bin/voice-agent models pull smart-turn --dir {folder}" in commands(
        done.stdout
    )


def test_dry_run_shows_both_environments_in_order() -> None:
    done = dry_run("--cuda", "cu126")
    assert done.returncode == 0, done.stderr
    run = commands(done.stdout)
    asr = [c for c in run if c.startswith("/nonexistent/venv/")]
    tts = [c for c in run if c.startswith("/nonexistent/venv-tts/")]
    assert any("install -q -e .[faster-whisper]" in c for c in asr)
    assert not any("chatterbox" in c or "torch" in c for c in asr[:-1])
    torch_at = next(i for i, c in enumerate(tts) if "torch==2.6.0" in c)
    chatterbox_at = next(i for i, c in enumerate(tts) if "chatterbox-tts" in c)
    assert torch_at < chatterbox_at, "torch for the host's CUDA goes in first"
    assert "download.pytorch.org/whl/cu126" in tts[torch_at]
    assert "torchaudio==2.6.0" in tts[torch_at]
    assert "--no-deps" in tts[chatterbox_at]
    deps = tts[chatterbox_at + 1]
    for package in (
        "librosa",
        "s3tokenizer",
        "transformers==5.2.",
        "diffusers==0.29.",
        "resemble-perth",
        "conformer",
        "safetensors",
        "omegaconf",
        "pyloudnorm",
        "setuptools<81",
    ):
        assert package in deps, package
    project = tts[chatterbox_at + 2]
    assert "--no-deps -e ." in project
    assert "fastapi" in tts[chatterbox_at + 3]


def test_dry_run_without_a_driver_still_prints(tmp_path: Path) -> None:
    done = dry_run(path=f"{tmp_path}:/usr/bin:/bin")  # no nvidia-smi on this PATH
    assert done.returncode == 0, done.stderr
    assert "no NVIDIA driver found" in done.stdout
    assert any("whl/cu124" in c for c in commands(done.stdout))


def test_real_run_without_a_driver_fails_clearly(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin", "VENV": str(tmp_path / "v")}
    done = subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=30, check=False
    )
    assert done.returncode == 1
    assert "no NVIDIA driver found" in done.stderr
    assert not (tmp_path / "v").exists()


@pytest.mark.parametrize(
    ("smi", "tag"), [("12.8", "cu126"), ("12.4", "cu124"), ("12.2", "cu118"), ("11.8", "cu118")]
)
def test_cuda_tag_follows_the_driver(tmp_path: Path, smi: str, tag: str) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        f"#!/bin/sh\necho '| NVIDIA-SMI 550.00   Driver Version: 550.00   CUDA Version: {smi} |'\n"
    )
    fake.chmod(0o755)
    done = dry_run(path=f"{tmp_path}:/usr/bin:/bin")
    assert done.returncode == 0, done.stderr
    assert f"whl/{tag}" in done.stdout
