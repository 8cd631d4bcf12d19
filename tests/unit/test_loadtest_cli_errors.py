"""Bad input to `voice-agent loadtest` and `voice-agent plan` is one line on stderr and exit
status 2, never a traceback; and an --out that cannot be written is found before the run,
not after it (the results were lost)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.client.stream import write_wav
from services.loadtest import cli
from services.loadtest.capacity import Budget
from services.ops.redis_server import free_port
from services.plan.cli import main as plan_main
from tests.unit.test_loadtest_samples import level_of

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "plan"


def _url() -> str:
    return f"ws://127.0.0.1:{free_port()}/v1/stream"  # nothing listens there


def _one_line(err: str) -> str:
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    ("flag", "kind"), [("--out", "is a folder, not a file"), ("--plots", "is a file, not a folder")]
)
def test_an_output_that_cannot_be_written_stops_the_run_before_it_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, kind: str
) -> None:
    target = tmp_path
    if flag == "--plots":
        target = tmp_path / "plots.png"
        target.touch()
    # no gateway listens at the URL: the error is about the output, found first
    assert cli.main(["--url", _url(), flag, str(target)]) == 2
    err = _one_line(capsys.readouterr().err)
    assert f"{flag} {target}: {kind}" in err


def test_the_summary_is_printed_before_the_results_are_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    audio = tmp_path / "audio"
    audio.mkdir()
    write_wav(audio / "a.wav", bytes(3200), 16000)

    async def no_probe(_url: str, _key: str | None) -> None:
        return None

    def levels(*_: Any) -> tuple[list[dict[str, Any]], Budget]:
        return [level_of(1, 20)], Budget(2000.0, "given")

    def disk_full(*_: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cli, "_probe", no_probe)
    monkeypatch.setattr(cli, "_run_levels", levels)
    monkeypatch.setattr(cli, "write", disk_full)
    out = tmp_path / "results.json"
    assert cli.main(["--url", _url(), "--audio", str(audio), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert "capacity: at least 1 sessions" in captured.out  # the run's findings, kept
    assert "cannot write the results" in _one_line(captured.err.splitlines()[-1] + "\n")


@pytest.mark.parametrize(
    "words",
    [
        ["--think-s", "0,inf"],
        ["--think-s", "nan,1"],
        ["--budget-ms", "inf"],
        ["--ramp", "nan"],
        ["--baseline-turns", "-1"],
    ],
)
def test_numbers_that_are_not_finite_are_usage_errors(
    words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["--url", _url(), *words])
    assert exited.value.code == 2
    assert "Traceback" not in capsys.readouterr().err


def test_a_script_that_is_not_utf8_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_wav(tmp_path / "cafe.wav", bytes(3200), 16000)
    (tmp_path / "cafe.txt").write_bytes("un café".encode("latin-1"))
    assert cli.main(["--url", _url(), "--audio", str(tmp_path)]) == 2
    err = _one_line(capsys.readouterr().err)
    assert f"{tmp_path / 'cafe.txt'}: not a readable UTF-8 script" in err


@pytest.mark.parametrize(
    ("words", "said"),
    [
        (["--out", "{tmp}"], "--out {tmp}: is a folder, not a file"),
        (["--json", "{tmp}"], "--json {tmp}: is a folder, not a file"),
        (["--turns-per-minute", "inf"], "--turns-per-minute: Input should be a finite number"),
        (["--asr-calls-per-turn", "inf"], "--asr-calls-per-turn: Input should be a finite number"),
        (["--reply-s-per-turn", "inf"], "--reply-s-per-turn: Input should be a finite number"),
        (["--turns-per-minute", "nan"], "--turns-per-minute: Input should be a finite number"),
        (["--budget-ms", "inf"], "--budget-ms: Input should be a finite number"),
        (["--turns-per-minute", "1e-320"], "--turns-per-minute: Input should be greater"),
        (["--turns-per-minute", "1e308"], "--turns-per-minute: Input should be less"),
        (["--reply-s-per-turn", "1e-320"], "--reply-s-per-turn: Input should be greater"),
        (["--asr-calls-per-turn", "1e-320"], "--asr-calls-per-turn: Input should be greater"),
        (["--redis-turns-per-s", "1e-320"], "--redis-turns-per-s: Input should be greater"),
    ],
)
def test_plan_usage_errors_exit_2_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], words: list[str], said: str
) -> None:
    argv = [str(FIXTURES), *(w.replace("{tmp}", str(tmp_path)) for w in words)]
    with pytest.raises(SystemExit) as exited:
        plan_main(argv)
    assert exited.value.code == 2
    err = _one_line(capsys.readouterr().err)
    assert said.replace("{tmp}", str(tmp_path)) in err
