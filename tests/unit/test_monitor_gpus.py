"""scripts/monitor_gpus.sh with a fake nvidia-smi, a failing one, a hung one, none, and real
/health (open, and protected: brief without a credential, whole with VA_API_KEY)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from services.asr.app import create_app as asr_app
from services.asr.settings import AsrSettings
from services.common.auth.api_keys import KeyStore
from services.common.auth.settings import AuthSettings, Limits
from services.common.bus.connection import connect
from services.ops.redis_server import free_port
from tests.conftest import RedisProc
from tests.ops_app import ops_app
from tests.servers import ServerThread

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "monitor_gpus.sh"
QUERY = (
    "--query-gpu=index,name,temperature.gpu,utilization.gpu,utilization.memory,"
    "memory.used,memory.total --format=csv,noheader,nounits"
)
TOOLS = ("bash", "env", "awk", "head", "curl", "date", "sleep", "sed", "timeout")

FAKE_SMI = f"""#!/bin/sh
[ "$*" = "{QUERY}" ] || {{ echo "unexpected arguments: $*" >&2; exit 3; }}
echo "0, NVIDIA GeForce RTX 3090, 45, 25, 20, 4096, 24576"
echo "1, NVIDIA GeForce RTX 3090, [N/A], 35, 18, 3584, 24576"
"""
HUNG_SMI = """#!/bin/sh
exec sleep 60
"""
BROKEN_SMI = """#!/bin/sh
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
echo "Make sure that the latest NVIDIA driver is installed and running."
exit 9
"""


def bin_dir(folder: Path, nvidia_smi: str | None) -> Path:
    """A PATH folder with just the tools the script uses, and maybe an nvidia-smi."""
    folder.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, f"{tool} is needed by the test"
        (folder / tool).symlink_to(found)
    (folder / "python3").symlink_to(Path(sys.executable).resolve())  # not a pyenv shim
    if nvidia_smi is not None:
        (folder / "nvidia-smi").write_text(nvidia_smi)
        (folder / "nvidia-smi").chmod(0o755)
    return folder


@pytest.fixture(scope="module")
def services(redis_server: RedisProc) -> Iterator[dict[str, str]]:
    """Real /health for ASR and one gateway; TTS is down (nothing on its port)."""
    redis = redis_server.settings()
    with (
        ServerThread(ops_app("asr", redis, engine="faster-whisper")) as asr,
        ServerThread(ops_app("gateway", redis)) as gateway,
    ):
        dead = f"http://127.0.0.1:{free_port()}"
        yield {
            "VA_MONITOR_ASR_URL": asr.http,
            "VA_MONITOR_TTS_URL": dead,
            "VA_MONITOR_GATEWAY_URL": f"{gateway.http} {dead}",
        }


def run(path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args],
        env={"PATH": str(path), "HOME": os.environ.get("HOME", "/"), **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_once_prints_the_gpu_table_and_health(tmp_path: Path, services: dict[str, str]) -> None:
    done = run(bin_dir(tmp_path / "bin", FAKE_SMI), services, "--once")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    table = [line.split() for line in lines if line[:1].isdigit()]
    assert table == [
        ["0", "NVIDIA", "GeForce", "RTX", "3090", "45C", "25%", "20%", "4096", "/", "24576"],
        ["1", "NVIDIA", "GeForce", "RTX", "3090", "[N/A]", "35%", "18%", "3584", "/", "24576"],
    ]  # a field the GPU does not support is shown as nvidia-smi says it
    asr = next(line for line in lines if line.startswith("asr"))
    assert " UP " in asr and "engine=faster-whisper" in asr and "ready" in asr
    assert "queue=0" in asr
    assert next(line for line in lines if line.startswith("tts")).endswith("DOWN")
    gateways = [line for line in lines if line.startswith("gateway")]
    assert len(gateways) == 2 and " UP " in gateways[0] and gateways[1].endswith("DOWN")


def test_no_nvidia_smi_on_path(tmp_path: Path, services: dict[str, str]) -> None:
    done = run(bin_dir(tmp_path / "bin", None), services, "--once")
    assert done.returncode == 0, done.stderr
    assert "no GPUs: nvidia-smi not found" in done.stdout
    assert any(line.startswith("asr") and " UP " in line for line in done.stdout.splitlines())


def test_failing_nvidia_smi(tmp_path: Path, services: dict[str, str]) -> None:
    done = run(bin_dir(tmp_path / "bin", BROKEN_SMI), services, "--once")
    assert done.returncode == 0, done.stderr
    assert "no GPUs: nvidia-smi failed: NVIDIA-SMI has failed because it couldn't" in done.stdout


def test_a_hung_nvidia_smi_is_cut_short(tmp_path: Path, services: dict[str, str]) -> None:
    started = time.monotonic()
    env = {**services, "VA_MONITOR_SMI_TIMEOUT": "1"}
    done = run(bin_dir(tmp_path / "bin", HUNG_SMI), env, "--once")
    assert done.returncode == 0, done.stderr
    assert "no GPUs: nvidia-smi did not answer within 1 s" in done.stdout
    assert any(line.startswith("asr") and " UP " in line for line in done.stdout.splitlines())
    assert time.monotonic() - started < 20


@pytest.fixture(scope="module")
def protected(redis_server: RedisProc) -> Iterator[tuple[str, str]]:
    """An ASR service whose ops routes need a credential (VA_AUTH__PROTECT_OPS): its URL
    and an API key."""
    redis = redis_server.settings()
    auth = AuthSettings(required=True, token_secret=SecretStr("s" * 40), protect_ops=True)

    async def new_key() -> str:
        client = connect(redis)
        try:
            return (await KeyStore(client, redis.prefix).create("ops", "monitor", Limits()))[1]
        finally:
            await client.aclose()

    key = asyncio.run(new_key())
    with ServerThread(asr_app(AsrSettings(profile="fake", redis=redis, auth=auth))) as asr:
        yield asr.http, key


@pytest.mark.parametrize(
    ("credential", "words"),
    [
        (
            None,
            "UP   healthy; details need a credential (VA_AUTH__PROTECT_OPS): VA_API_KEY is not set",
        ),
        (
            "va_wrong",
            "details need a credential (VA_AUTH__PROTECT_OPS): VA_API_KEY was not accepted",
        ),
        ("the key", "engine=fake device=cpu ready"),
    ],
)
def test_protected_health_and_a_bearer_token(
    tmp_path: Path, protected: tuple[str, str], credential: str | None, words: str
) -> None:
    url, key = protected
    env = {"VA_MONITOR_ASR_URL": url, "VA_MONITOR_TTS_URL": url, "VA_MONITOR_GATEWAY_URL": url}
    if credential is not None:
        env["VA_API_KEY"] = key if credential == "the key" else credential
    done = run(bin_dir(tmp_path / "bin", None), env, "--once")
    assert done.returncode == 0, done.stderr
    asr = next(line for line in done.stdout.splitlines() if line.startswith("asr"))
    assert words in asr and "NOT-READY" not in asr, asr


def test_refreshes_until_interrupted(tmp_path: Path, services: dict[str, str]) -> None:
    path = bin_dir(tmp_path / "bin", FAKE_SMI)
    proc = subprocess.Popen(
        [str(SCRIPT), "--interval", "0.2"],
        env={"PATH": str(path), **services},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # Ctrl-C must reach it even where this test runs with SIGINT ignored (a background
        # CI job): a shell cannot trap a signal that was ignored when it started
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout is not None
    seen = []
    while sum(line.startswith("----") for line in seen) < 3:  # two whole refreshes, then Ctrl-C
        line = proc.stdout.readline()
        assert line, "".join(seen)
        seen.append(line)
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    out = "".join(seen) + out
    assert out.count("GPU  NAME") >= 2 and out.count("----") >= 2
    assert proc.returncode == 0


@pytest.mark.parametrize("args", [["--interval", "0"], ["--interval", "x"], ["--bogus"]])
def test_bad_arguments(tmp_path: Path, args: list[str]) -> None:
    done = run(bin_dir(tmp_path / "bin", None), {}, *args)
    assert done.returncode == 2 and done.stderr
