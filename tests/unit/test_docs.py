"""The user docs that are generated from code stay current."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from services.ops.cli import parser as cli_parser
from services.ops.registry import SERVICES
from services.ops.settings_doc import markdown, rows

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


# -- what the docs name exists ------------------------------------------------------------

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OTHER_VARIABLES = {
    "VA_API_KEY": "services/ops/cli.py",
    "VA_MONITOR_ASR_URL": "scripts/monitor_gpus.sh",
    "VA_MONITOR_TTS_URL": "scripts/monitor_gpus.sh",
    "VA_MONITOR_GATEWAY_URL": "scripts/monitor_gpus.sh",
    "VA_MONITOR_TIMEOUT": "scripts/monitor_gpus.sh",
    "VA_MONITOR_SMI_TIMEOUT": "scripts/monitor_gpus.sh",
}
"""Environment variables the docs name that are no service setting, and who reads them."""
_CODE = re.compile(r"```.*?```|`[^`\n]+`", re.DOTALL)
# (`sudo -u voice-agent ...` names the system user, not the command)
_COMMAND = re.compile(r"(?<!-u)(?:^|[\s/(`])voice-agent((?:[ \t]+[a-z][a-z0-9-]*)+)", re.MULTILINE)
_SETTING = re.compile(r"\bVA_[A-Z0-9_*]*[A-Z0-9*]")


def _settings() -> set[str]:
    return {
        env
        for entry in SERVICES.values()
        for env, _, _ in rows(entry.settings, entry.settings.model_construct(), "VA_")
    }


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def _unknown_command(words: list[str]) -> str | None:
    """The part of `voice-agent WORDS...` the CLI does not have (None: it has all)."""
    parser = cli_parser()
    for depth, word in enumerate(words):
        choices = _subcommands(parser)
        if not choices:
            return None  # the rest are arguments
        if word not in choices:
            return " ".join(words[: depth + 1]) if depth == 0 or word.isidentifier() else None
        parser = choices[word]
    return None


def test_every_command_the_docs_name_exists() -> None:
    """In code (`...` and fenced blocks): prose says "voice-agent" of the project too."""
    wrong = []
    for path in DOCS:
        for code in _CODE.findall(path.read_text()):
            for match in _COMMAND.finditer(code):
                unknown = _unknown_command(match.group(1).split())
                if unknown is not None:
                    wrong.append(f"{path.relative_to(ROOT)}: voice-agent {unknown}")
    assert not wrong, wrong


def test_every_setting_the_docs_name_exists() -> None:
    """A setting, a `*` standing for any part (`VA_*__SERVER__PORT`), or a section
    (`VA_ASR__WHISPER__…`)."""
    known = _settings()
    wrong = []
    for path in DOCS:
        for name in set(_SETTING.findall(path.read_text())) - OTHER_VARIABLES.keys():
            pattern = re.compile(re.escape(name).replace(r"\*", "[A-Z0-9_]+") + "($|__)")
            if not any(pattern.match(setting) for setting in known):
                wrong.append(f"{path.relative_to(ROOT)}: {name}")
    assert not wrong, sorted(wrong)
    for name, reader in OTHER_VARIABLES.items():
        assert name in (ROOT / reader).read_text(), (name, reader)


def test_the_checks_catch_what_does_not_exist() -> None:
    assert _unknown_command(["deploy"]) == "deploy"
    assert _unknown_command(["keys", "rotate"]) == "keys rotate"
    assert _unknown_command(["keys", "create", "--tenant", "acme"]) is None
    assert _unknown_command(["models", "pull", "chatterbox"]) is None
    assert "VA_GATEWAY__END_OF_TURN_DOUBT_MS" in _settings()
    assert "VA_GATEWAY__NO_SUCH_THING" not in _settings()
