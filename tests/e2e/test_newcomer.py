"""The newcomer's path, walked on every `make test`: what `make run` gives a stranger.

In a throw-away copy of the checkout (the files a fresh clone would have), `make
install-lite` (exactly the install step of `make run`) builds a fresh `.venv`; then
`.venv/bin/voice-agent up` (exactly what `make run` starts) runs on free ports with a
Redis of its own; one spoken turn goes through `/v1/stream` with `voice-agent client`
from that environment; every command's `--help` answers; a command whose optional extra
the default install lacks exits 2 naming the install; Ctrl-C stops everything cleanly.

A runtime import that needs something the default install lacks fails here, loudly,
instead of in a user's first minute. pip's cache keeps it to about a minute.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import wave
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

from services.client.stream import write_wav
from services.ops.cli import wait_ready
from services.ops.redis_server import free_port
from tests.speech import speak, to_pcm16

REPO = Path(__file__).resolve().parents[2]
QUESTION = "what is the weather like in paris today"
INSTALL_TIMEOUT_S = 600
STOP_TIMEOUT_S = 40

pytestmark = [
    pytest.mark.skipif(
        shutil.which("git") is None or shutil.which("make") is None or not (REPO / ".git").exists(),
        reason="needs a git checkout, git and make",
    ),
    # the first test pays for the whole install (a fresh venv, Smart Turn's wheel): minutes
    # on a busy 2-core machine, which is a slow newcomer, not a broken one
    pytest.mark.timeout(INSTALL_TIMEOUT_S + 120),
]


@dataclass
class Newcomer:
    """A fresh checkout with the default install, and the environment to run it in."""

    root: Path
    env: dict[str, str]
    urls: dict[str, str]

    def voice_agent(
        self, *args: str, timeout: float = 60, **env: str
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.root / ".venv/bin/voice-agent"), *args],
            cwd=self.root,
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def _copy_checkout(to: Path) -> None:
    """The files a clone of this checkout would have (tracked, and new files not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        source = REPO / os.fsdecode(name)
        if source.is_file():  # a file deleted but not yet committed is not copied
            (to / source.relative_to(REPO)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / source.relative_to(REPO))


def _stranger_env(ports: dict[str, int], redis_port: int) -> dict[str, str]:
    """This machine's environment without this test run's Python or settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VA_", "PYTHON", "VIRTUAL"))}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(sys.prefix)]
    env["PATH"] = os.pathsep.join(path)
    env["VA_REDIS__URL"] = f"redis://127.0.0.1:{redis_port}/0"
    for name, port in ports.items():
        env[f"VA_{name.upper()}__SERVER__PORT"] = str(port)
    return env


@pytest.fixture(scope="module")
def newcomer(tmp_path_factory: pytest.TempPathFactory) -> Newcomer:
    root = tmp_path_factory.mktemp("fresh-clone")
    _copy_checkout(root)
    ports = {"asr": free_port(), "tts": free_port(), "gateway": free_port()}
    env = _stranger_env(ports, free_port())
    install = subprocess.run(
        ["make", "install-lite"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        check=False,
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    return Newcomer(root, env, urls)


@pytest.fixture(scope="module")
def running(newcomer: Newcomer) -> Iterator[subprocess.Popen[str]]:
    """`voice-agent up`, as `make run` starts it, until the test module is done."""
    log = (newcomer.root / "up.log").open("w")
    up = subprocess.Popen(
        [str(newcomer.root / ".venv/bin/voice-agent"), "up"],
        cwd=newcomer.root,
        env=newcomer.env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: cleaned up whole below
    )
    # (`up` installs its own Ctrl-C handler: it must stop on SIGINT even when this test
    # runs with SIGINT ignored, as in a background CI job)
    try:
        wait_ready(newcomer.urls, [up], 180, logs=str(newcomer.root / "up.log"))
        yield up
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
        log.close()


def test_default_install_has_no_optional_extra(newcomer: Newcomer) -> None:
    """What `make run` installs (pip's view), so a later change to it is deliberate."""
    listed = newcomer.voice_agent("--help")
    assert listed.returncode == 0, listed.stderr
    pip = subprocess.run(
        [str(newcomer.root / ".venv/bin/python"), "-m", "pip", "list", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    installed = {p["name"].lower() for p in json.loads(pip.stdout)}
    assert {"fastapi", "uvicorn", "redis", "onnxruntime", "av", "soxr"} <= installed
    assert not {"jiwer", "matplotlib", "torch", "pytest", "pipecat-ai"} & installed
    # Smart Turn's one file, extracted from its pinned wheel (no pipecat-ai install)
    pulled = newcomer.root / "models/smart-turn-v3.2"
    assert (pulled / "smart-turn-v3.2-cpu.onnx").stat().st_size > 8_000_000
    assert (pulled / "LICENSE").is_file()


def test_the_default_stack_ends_turns_with_smart_turn(
    newcomer: Newcomer, running: subprocess.Popen[str]
) -> None:
    """Semantic end of turn is what `make run` gives, not the 600 ms silence rule."""
    health = httpx.get(f"{newcomer.urls['gateway']}/health", timeout=10).json()
    assert health["end_of_turn"] == "smart-turn", health


def test_every_command_answers_help(newcomer: Newcomer) -> None:
    top = newcomer.voice_agent("--help")
    assert top.returncode == 0, top.stderr
    found = re.search(r"\{([a-z,-]+)\}", top.stdout)
    assert found is not None, top.stdout
    commands = found.group(1).split(",")
    assert {"up", "asr", "tts", "gateway", "client", "loadtest", "plan", "doctor"} <= set(commands)
    for words in [[c] for c in commands] + [["models", "pull"], ["models", "list"]]:
        shown = newcomer.voice_agent(*words, "--help")
        assert shown.returncode == 0, (words, shown.stderr)
        assert "usage: voice-agent" in shown.stdout, (words, shown.stdout)


def test_command_without_its_extra_names_the_install(newcomer: Newcomer) -> None:
    refused = newcomer.voice_agent("loadtest", "--sessions", "1", "--duration", "1")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert "loadtest" in line and "pip install -e '.[loadtest]'" in line, line
    assert "Traceback" not in refused.stdout + refused.stderr


def test_the_browser_page_and_its_voice_list(
    newcomer: Newcomer, running: subprocess.Popen[str]
) -> None:
    """What README's "Try it in the browser" says to open after `make run`."""
    page = httpx.get(f"{newcomer.urls['gateway']}/", timeout=10)
    assert page.status_code == 200 and "/static/app.js" in page.text
    voices = httpx.get(f"{newcomer.urls['gateway']}/v1/voices", timeout=10)
    assert voices.status_code == 200, voices.text  # `up` points the gateway at its TTS
    assert voices.json()["voices"], voices.json()


def test_a_second_up_names_the_ports_in_use(
    newcomer: Newcomer, running: subprocess.Popen[str]
) -> None:
    """`make run` twice: the second says why it cannot start, and never that it is up."""
    second = newcomer.voice_agent("up")
    said = second.stdout + second.stderr
    assert second.returncode == 1, said
    assert "voice-agent is up" not in said and "Traceback" not in said, said
    port = newcomer.urls["gateway"].rsplit(":", 1)[1]
    assert f"{port} (gateway: VA_GATEWAY__SERVER__PORT)" in said and "in use" in said, said


@pytest.mark.parametrize(
    ("words", "env", "says"),
    [
        (["client", "--wav", "nope.wav"], {}, "cannot read nope.wav"),
        (
            ["client", "--wav", "pyproject.toml", "--url", "ws://127.0.0.1:9/v1/stream"],
            {},
            "pyproject.toml: ",
        ),
        (["gateway"], {"VA_GATEWAY__END_OF_TURN": "bogus"}, "VA_GATEWAY__END_OF_TURN=bogus"),
        (["up"], {"VA_VAD__MIN_SILENCE_MS": "5"}, "VA_VAD__MIN_SILENCE_MS=5"),
    ],
    ids=["missing-file", "not-audio", "bad-policy", "bad-bound"],
)
def test_a_mistake_is_one_line_not_a_traceback(
    newcomer: Newcomer, words: list[str], env: dict[str, str], says: str
) -> None:
    refused = newcomer.voice_agent(*words, **env)
    assert refused.returncode in (1, 2), refused.stdout + refused.stderr
    assert "Traceback" not in refused.stdout + refused.stderr, refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert says in line, line


def test_the_client_says_when_nothing_listens(newcomer: Newcomer, tmp_path: Path) -> None:
    question = tmp_path / "question.wav"
    write_wav(question, to_pcm16(np.zeros(1600, np.float32)), 16000)
    url = f"ws://127.0.0.1:{free_port()}/v1/stream"
    refused = newcomer.voice_agent("client", "--wav", str(question), "--url", url)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert f"cannot reach the gateway at {url}" in line and "make run" in line, line


def test_one_spoken_turn_then_a_clean_stop(
    newcomer: Newcomer, running: subprocess.Popen[str], tmp_path: Path
) -> None:
    question, reply = tmp_path / "question.wav", tmp_path / "reply.wav"
    silence = np.zeros(4800, np.float32)
    # a recording that goes on well past the speech: the agent answers before it ends
    tail = np.zeros(24_000, np.float32)
    write_wav(question, to_pcm16(np.concatenate([silence, speak(QUESTION, 16000), tail])), 16000)
    gateway = newcomer.urls["gateway"].replace("http://", "ws://") + "/v1/stream"
    talked = newcomer.voice_agent(
        "client", "--wav", str(question), "--out", str(reply), "--url", gateway, timeout=90
    )
    assert talked.returncode == 0, talked.stdout[-2000:] + talked.stderr[-2000:]
    events = [json.loads(line) for line in talked.stdout.splitlines() if line.startswith("{")]
    created = events[0]
    assert created["type"] == "session.created" and created["session"]["agent"] == "echo"
    assert "echo agent answers" in created["notice"]  # README: no LLM, and the notice says so
    finals = [e["text"] for e in events if e["type"] == "transcript.final"]
    assert len(finals) == 1 and {"weather", "paris"} & set(finals[0].lower().split()), finals
    assert [e["status"] for e in events if e["type"] == "response.done"] == ["completed"]
    with wave.open(str(reply)) as saved:
        assert saved.getnframes() / saved.getframerate() > 0.5  # agent audio came back
    # counted from the end of the speech, so the file's 1.5 s of silence cannot make it
    # negative
    (v2v,) = re.findall(
        r"^voice-to-voice: (-?\d+) ms \(from the end of the speech", talked.stdout, re.M
    )
    assert 0 < int(v2v) < 10_000, talked.stdout[-500:]

    running.send_signal(signal.SIGINT)  # Ctrl-C, as a user stops `make run`
    assert running.wait(timeout=STOP_TIMEOUT_S) == 0, (newcomer.root / "up.log").read_text()
    leftover = subprocess.run(
        ["pgrep", "-g", str(running.pid)], capture_output=True, text=True, check=False
    )
    assert leftover.stdout.strip() == "", "processes left running after Ctrl-C"
