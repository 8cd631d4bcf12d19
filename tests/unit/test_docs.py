"""The user docs that are generated from code stay current."""

from __future__ import annotations

from pathlib import Path

from services.ops.settings_doc import markdown

ROOT = Path(__file__).resolve().parents[2]


def test_configuration_doc_is_current() -> None:
    current = (ROOT / "docs" / "configuration.md").read_text()
    assert current.strip() == markdown().strip(), (
        "docs/configuration.md is stale: "
        "run `voice-agent config --markdown > docs/configuration.md`"
    )


def test_every_setting_is_documented() -> None:
    undocumented = [line for line in markdown().splitlines() if line.endswith("|  |")]
    assert not undocumented, undocumented
