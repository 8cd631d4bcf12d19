"""`voice-agent models`: name resolution, the offline error, a (faked) download."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import huggingface_hub
import pytest
from huggingface_hub import errors

from services.asr.engines.whisper_files import resolve_model_dir
from services.asr.settings import WhisperSettings
from services.ops import models
from services.ops.cli import main
from services.ops.models import ModelError, pull, spec
from services.tts.engines.chatterbox import REQUIRED_FILES
from services.tts.settings import ChatterboxSettings


def test_names_map_to_the_repos_faster_whisper_uses() -> None:
    from faster_whisper.utils import _MODELS

    for size, repo in models.FASTER_WHISPER_REPOS.items():
        assert _MODELS[size] == repo, size
    assert spec("faster-whisper-large-v3-turbo").repo == _MODELS["large-v3-turbo"]
    assert spec("faster-whisper-large-v3-turbo").repo == (
        "mobiuslabsgmbh/faster-whisper-large-v3-turbo"
    )
    assert spec("chatterbox").repo == "ResembleAI/chatterbox"


def test_pulled_folders_are_where_the_engines_look(tmp_path: Path) -> None:
    whisper = WhisperSettings(model="large-v3-turbo", models_dir=tmp_path)
    assert resolve_model_dir(whisper) == tmp_path / spec("faster-whisper-large-v3-turbo").name
    chatterbox = ChatterboxSettings(models_dir=tmp_path)
    assert chatterbox.models_dir / chatterbox.model == tmp_path / spec("chatterbox").name
    assert set(REQUIRED_FILES) <= set(spec("chatterbox").files)
    assert "conds.pt" in spec("chatterbox").files


def test_unknown_name_lists_the_choices() -> None:
    with pytest.raises(ModelError, match="choose one of: faster-whisper-tiny"):
        spec("whisper-huge")


def test_offline_names_what_failed_and_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ModelError) as caught:
        pull("chatterbox", tmp_path, {"HF_HUB_OFFLINE": "1"})
    message = str(caught.value)
    assert "HF_HUB_OFFLINE=1" in message
    assert "ResembleAI/chatterbox" in message
    assert f"voice-agent models pull chatterbox --dir {tmp_path}" in message
    assert str(tmp_path / "chatterbox") in message
    assert not (tmp_path / "chatterbox").exists()


def test_offline_cli_exits_non_zero_with_the_message(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    pull_command = ["models", "pull", "chatterbox", "--dir", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, "-m", "services.ops.cli", *pull_command],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "voice-agent models pull: error: cannot download chatterbox" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (errors.LocalEntryNotFoundError("ConnectError: name not known"), "not reachable"),
        (ConnectionError("connection refused"), "not reachable"),
        (errors.OfflineModeIsEnabled("offline"), "not reachable"),
        (RuntimeError("disk on fire"), re.escape("failed (RuntimeError: disk on fire)")),
    ],
)
def test_no_network_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raised: Exception, expected: str
) -> None:
    def fail(**_: Any) -> str:
        raise raised

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fail)
    with pytest.raises(ModelError, match=expected) as caught:
        pull("faster-whisper-tiny", tmp_path, {})
    assert "copy a pulled faster-whisper-tiny folder" in str(caught.value)
    assert not (tmp_path / "faster-whisper-tiny").exists()  # no empty folder left behind


class Refused(errors.RepositoryNotFoundError):
    def __init__(self) -> None:
        Exception.__init__(self, "401 Client Error")


def test_refused_repo_says_how_to_log_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(**_: Any) -> str:
        raise Refused()

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fail)
    with pytest.raises(ModelError, match="HF_TOKEN"):
        pull("chatterbox", tmp_path, {})


def fake_snapshot(files: list[str]) -> Any:
    calls: list[dict[str, Any]] = []

    def download(**kwargs: Any) -> str:
        calls.append(kwargs)
        for name in files:
            (Path(kwargs["local_dir"]) / name).write_bytes(b"weights")
        return str(kwargs["local_dir"])

    download.calls = calls  # type: ignore[attr-defined]
    return download


def test_pull_downloads_only_what_the_engine_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    download = fake_snapshot([*REQUIRED_FILES, "conds.pt"])
    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    main(["models", "pull", "chatterbox", "--dir", str(tmp_path)])
    (call,) = download.calls
    assert call["repo_id"] == "ResembleAI/chatterbox"
    assert call["local_dir"] == tmp_path / "chatterbox"
    assert call["allow_patterns"] == list(models.CHATTERBOX_FILES)
    assert "ready in" in capsys.readouterr().out
    main(["models", "pull", "chatterbox", "--dir", str(tmp_path)])  # complete: no second fetch
    assert len(download.calls) == 1
    main(["models", "list", "--dir", str(tmp_path)])
    listed = capsys.readouterr().out.splitlines()
    assert any(line.startswith("chatterbox") and line.endswith("pulled") for line in listed)
    assert any(line.startswith("faster-whisper-large-v3-turbo") for line in listed)


def test_an_incomplete_download_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot(["config.json"]))
    with pytest.raises(ModelError, match=r"gave no .*model\.bin"):
        pull("faster-whisper-tiny", tmp_path, {})


def test_moshi_and_personaplex_can_be_pulled_for_the_duplex_service(tmp_path: Path) -> None:
    from services.duplex.engines.moshi import model_folder
    from services.duplex.settings import MoshiSettings

    moshi = spec("moshiko-pytorch-bf16")
    assert (moshi.repo, moshi.engine) == ("kyutai/moshiko-pytorch-bf16", "duplex")
    assert "config.json" in moshi.files and "config.json" not in moshi.required()
    assert spec("moshika-pytorch-bf16").repo == "kyutai/moshika-pytorch-bf16"
    assert spec("personaplex-7b-v1").repo == "nvidia/personaplex-7b-v1"
    # the engine reads the folder `models pull` fills
    settings = MoshiSettings(model="moshiko-pytorch-bf16", models_dir=tmp_path)
    assert model_folder(settings) == tmp_path / "moshiko-pytorch-bf16"


def test_a_piper_voice_is_pulled_flat_into_the_voices_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`models pull piper-<voice>` asks rhasspy/piper-voices for the voice's two files and
    puts them where the Piper engine looks: it then speaks the voice by name."""
    import json

    from services.tts.engines.piper import JOE, PiperEngine
    from services.tts.settings import PiperSettings

    calls: list[dict[str, Any]] = []
    source = JOE.verify() / "en_US-joe-medium.onnx"

    def download(**kwargs: Any) -> str:
        calls.append(kwargs)
        for pattern in kwargs["allow_patterns"]:
            target = Path(kwargs["local_dir"]) / pattern
            target.parent.mkdir(parents=True, exist_ok=True)
            if pattern.endswith(".json"):
                config = json.loads(source.with_name(f"{source.name}.json").read_text())
                config["language"] = {"code": "de_DE"}
                target.write_text(json.dumps(config))
            else:
                target.write_bytes(source.read_bytes())  # stands in for the German weights
        return str(kwargs["local_dir"])

    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    voices = tmp_path / "voices"
    main(["models", "pull", "piper-de_DE-thorsten-medium", "--dir", str(voices)])
    (call,) = calls
    assert call["repo_id"] == "rhasspy/piper-voices"
    folder = "de/de_DE/thorsten/medium"
    assert call["allow_patterns"] == [
        f"{folder}/de_DE-thorsten-medium.onnx",
        f"{folder}/de_DE-thorsten-medium.onnx.json",
    ]
    assert sorted(p.name for p in voices.iterdir()) == [
        "de_DE-thorsten-medium.onnx",
        "de_DE-thorsten-medium.onnx.json",
    ]
    assert "ready in" in capsys.readouterr().out
    main(["models", "pull", "piper-de_DE-thorsten-medium", "--dir", str(voices)])
    assert len(calls) == 1  # complete: no second fetch
    engine = PiperEngine(PiperSettings(voices_dir=voices))
    assert "de_DE-thorsten-medium" in engine.voices()


def test_a_piper_voice_name_is_checked_before_any_download(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="not a Piper voice name"):
        pull("piper-thorsten", tmp_path, {})
    with pytest.raises(ModelError, match="HF_HUB_OFFLINE=1 forbids it"):
        pull("piper-de_DE-thorsten-medium", tmp_path, {"HF_HUB_OFFLINE": "1"})
