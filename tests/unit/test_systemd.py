"""The systemd units and scripts/install_systemd.sh: rendering, required keys, verification."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from services.gateway.drain import stop_budget_s

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "scripts" / "install_systemd.sh"
UNITS = ("voice-agent-asr.service", "voice-agent-tts.service", "voice-agent-gateway@.service")
VENV = Path(sys.prefix)  # an existing environment, so `systemd-analyze verify` finds python

Unit = dict[str, dict[str, list[str]]]


def install(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(INSTALL), *args], capture_output=True, text=True, timeout=60, check=False
    )


def parse_unit(path: Path) -> Unit:
    """section → key → values (systemd allows a key more than once, configparser does not)."""
    unit: Unit = defaultdict(lambda: defaultdict(list))
    section = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        unit[section][key.strip()].append(value.strip())
    return unit


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    prefix = tmp_path_factory.mktemp("root")
    done = install(
        "--prefix", str(prefix), "--install-dir", str(ROOT), "--venv", str(VENV),
        "--tts-venv", str(VENV), "--gateway-ports", "8000,8010", "--drain-timeout", "30",
        "--user", "va", "--state-dir", "/srv/va",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (
        "would enable: voice-agent.target voice-agent-asr.service voice-agent-tts.service "
        "voice-agent-gateway@8000.service voice-agent-gateway@8010.service"
    ) in done.stdout
    return prefix


def units_dir(prefix: Path) -> Path:
    return prefix / "etc" / "systemd" / "system"


def test_every_placeholder_is_rendered(rendered: Path) -> None:
    for path in [*units_dir(rendered).iterdir(), rendered / "etc/voice-agent/voice-agent.env"]:
        text = path.read_text()
        assert "@" not in text.replace("voice-agent-gateway@", ""), path
    assert (rendered / "srv/va/models").is_dir()


def test_units_carry_what_operations_needs(rendered: Path) -> None:
    for name in UNITS:
        unit = parse_unit(units_dir(rendered) / name)
        after, wants = " ".join(unit["Unit"]["After"]), " ".join(unit["Unit"]["Wants"])
        assert "redis-server.service" in after and "redis-server.service" in wants, name
        assert unit["Unit"]["PartOf"] == ["voice-agent.target"]
        service = unit["Service"]
        assert service["Restart"] == ["on-failure"]
        assert service["TimeoutStopSec"] == [str(3 * 30 + 15)]  # covers the drain budget
        assert service["EnvironmentFile"] == ["/etc/voice-agent/voice-agent.env"]
        assert service["User"] == ["va"] and service["WorkingDirectory"] == [str(ROOT)]
        for key, value in {
            "NoNewPrivileges": "yes",
            "ProtectSystem": "strict",
            "ReadWritePaths": "/srv/va",
            "PrivateTmp": "yes",
            "ProtectKernelTunables": "yes",
            "ProtectKernelModules": "yes",
            "ProtectControlGroups": "yes",
            "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
            "CapabilityBoundingSet": "",
        }.items():
            assert service[key] == [value], (name, key)
        assert service["ProtectHome"] in (["yes"], ["read-only"])
        assert unit["Install"]["WantedBy"] == ["voice-agent.target"]


def test_gpu_units_own_one_gpu_each_and_keep_device_access(rendered: Path) -> None:
    asr = parse_unit(units_dir(rendered) / "voice-agent-asr.service")["Service"]
    tts = parse_unit(units_dir(rendered) / "voice-agent-tts.service")["Service"]
    gateway = parse_unit(units_dir(rendered) / "voice-agent-gateway@.service")["Service"]
    assert "CUDA_VISIBLE_DEVICES=0" in asr["Environment"]
    assert "CUDA_VISIBLE_DEVICES=1" in tts["Environment"]
    for service in (asr, tts):
        assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in service["Environment"]  # = nvidia-smi order
        assert "PrivateDevices" not in service and "DevicePolicy" not in service
    assert gateway["PrivateDevices"] == ["yes"]
    assert asr["ExecStart"] == [f"{VENV}/bin/python services/asr/server.py --port 8001"]
    assert tts["ExecStart"] == [f"{VENV}/bin/python services/tts/server.py --port 8002"]
    assert gateway["ExecStart"] == [f"{VENV}/bin/python services/gateway/server.py --port %i"]
    assert "VA_GATEWAY__GATEWAY_ID=gw-%l-%i" in gateway["Environment"]


def test_the_gateways_stop_timeout_covers_its_sigterm_drain(rendered: Path) -> None:
    """systemd kills a unit still stopping after TimeoutStopSec: the gateway's drain on
    SIGTERM (its grace period, the closes, uvicorn's shutdown) must fit, with a margin."""
    gateway = parse_unit(units_dir(rendered) / "voice-agent-gateway@.service")["Service"]
    (stop,) = gateway["TimeoutStopSec"]
    assert float(stop) >= stop_budget_s(30) + 10  # rendered with --drain-timeout 30


def test_target_and_env_file(rendered: Path) -> None:
    target = parse_unit(units_dir(rendered) / "voice-agent.target")
    assert target["Install"]["WantedBy"] == ["multi-user.target"]
    env = rendered / "etc/voice-agent/voice-agent.env"
    assert env.stat().st_mode & 0o777 == 0o640
    lines = env.read_text().splitlines()
    assert "VA_GATEWAY__SERVER__DRAIN_TIMEOUT_S=30" in lines
    assert "VA_ASR__WHISPER__MODELS_DIR=/srv/va/models" in lines
    assert "VA_GATEWAY__MODELS_DIR=/srv/va/models" in lines  # Smart Turn (install_gpu.sh)
    # ProtectSystem=strict: only the state folder is writable, uploaded voices included
    assert "VA_TTS__VOICES__DIR=/srv/va/voices" in lines
    assert (rendered / "srv/va/voices").is_dir()
    per_unit = ("CUDA_VISIBLE_DEVICES", "VA_GATEWAY__GATEWAY_ID")  # the units set these
    assert not any(line.startswith(per_unit) for line in lines)


def test_existing_env_file_is_kept(tmp_path: Path) -> None:
    env = tmp_path / "etc/voice-agent/voice-agent.env"
    env.parent.mkdir(parents=True)
    env.write_text("VA_PROFILE=lite\n")
    done = install("--prefix", str(tmp_path), "--tts-venv", str(VENV))
    assert done.returncode == 0, done.stderr
    assert env.read_text() == "VA_PROFILE=lite\n" and "keeping existing" in done.stdout


def stop_timeouts(prefix: Path) -> set[str]:
    return {
        value
        for name in UNITS
        for value in parse_unit(units_dir(prefix) / name)["Service"]["TimeoutStopSec"]
    }


def test_a_rerun_keeps_the_drain_budget_of_the_env_file(tmp_path: Path) -> None:
    """The services drain for what the env file says: a re-run without --drain-timeout
    must not shrink TimeoutStopSec back to the default's (systemd would kill them mid-drain);
    a re-run with it changes both."""
    first = install("--prefix", str(tmp_path), "--tts-venv", str(VENV), "--drain-timeout", "60")
    assert first.returncode == 0, first.stderr
    env = tmp_path / "etc/voice-agent/voice-agent.env"
    assert stop_timeouts(tmp_path) == {str(3 * 60 + 15)}

    again = install("--prefix", str(tmp_path), "--tts-venv", str(VENV))
    assert again.returncode == 0, again.stderr
    assert stop_timeouts(tmp_path) == {str(3 * 60 + 15)}
    assert "VA_GATEWAY__SERVER__DRAIN_TIMEOUT_S=60" in env.read_text().splitlines()

    env.write_text(env.read_text().replace("VA_ASR__SERVER__DRAIN_TIMEOUT_S=60", ""))
    env.chmod(0o600)
    changed = install("--prefix", str(tmp_path), "--tts-venv", str(VENV), "--drain-timeout", "45")
    assert changed.returncode == 0, changed.stderr
    assert stop_timeouts(tmp_path) == {str(3 * 45 + 15)}
    lines = env.read_text().splitlines()
    for service in ("ASR", "TTS", "GATEWAY"):  # the missing one added
        assert [line for line in lines if f"{service}__SERVER__DRAIN_TIMEOUT_S" in line] == [
            f"VA_{service}__SERVER__DRAIN_TIMEOUT_S=45"
        ]
    assert env.stat().st_mode & 0o777 == 0o600  # the site's file keeps its mode


def test_the_drain_budget_read_from_an_env_file_rounds_up(tmp_path: Path) -> None:
    env = tmp_path / "etc/voice-agent/voice-agent.env"
    env.parent.mkdir(parents=True)
    env.write_text(
        "VA_GATEWAY__SERVER__DRAIN_TIMEOUT_S=30\n"
        'VA_TTS__SERVER__DRAIN_TIMEOUT_S="40.5"\n'
        "#VA_ASR__SERVER__DRAIN_TIMEOUT_S=900\n"
    )
    done = install("--prefix", str(tmp_path), "--tts-venv", str(VENV))
    assert done.returncode == 0, done.stderr
    assert stop_timeouts(tmp_path) == {str(3 * 41 + 15)}
    assert "drain budget: 41 s" in done.stdout
    assert "VA_TTS__VOICES__DIR" in done.stderr  # an older env file: what to add


def test_dry_run_changes_nothing(tmp_path: Path) -> None:
    done = install("--dry-run", "--gateway-ports", "8000,8010")
    assert done.returncode == 0, done.stderr
    for action in (
        "[dry-run] write /etc/systemd/system/voice-agent-asr.service",
        "[dry-run] systemctl daemon-reload",
        "[dry-run] systemctl enable voice-agent.target voice-agent-asr.service "
        "voice-agent-tts.service voice-agent-gateway@8000.service "
        "voice-agent-gateway@8010.service",
    ):
        assert action in done.stdout
    done = install("--dry-run", "--prefix", str(tmp_path))
    assert done.returncode == 0 and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "args",
    [
        ["--gateway-ports", "80x0"],
        ["--drain-timeout", "ten"],
        ["--user", "Bad User"],
        ["--bogus"],
        ["--install-dir", "relative/path"],
    ],
)
def test_bad_arguments_are_refused(args: list[str], tmp_path: Path) -> None:
    done = install("--prefix", str(tmp_path), *args)
    assert done.returncode == 2 and list(tmp_path.iterdir()) == []


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_analyze_verify(rendered: Path) -> None:
    folder = units_dir(rendered)
    names = [
        "voice-agent-asr.service",
        "voice-agent-tts.service",
        "voice-agent-gateway@8000.service",  # an instance of the template
        "voice-agent.target",
    ]
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *(str(folder / n) for n in names)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    ours = [line for line in done.stderr.splitlines() if "voice-agent" in line]
    assert done.returncode == 0 and not ours, done.stderr
