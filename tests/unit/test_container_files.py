"""compose.yaml, compose.gpu.yaml, the Dockerfiles, their locks and nginx config: what they
promise, checked without running anything (tests/e2e/test_containers.py runs them)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from services.ops.deploy import NginxSite, render_nginx
from services.ops.models import MODELS
from tests.compose_runner import interpolate, load

ROOT = Path(__file__).resolve().parents[2]
CONTAINERS = ROOT / "deploy" / "containers"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
IMAGE = f"ghcr.io/voice-agent/voice-agent:{PROJECT['version']}"
DOCKERFILES = {v: CONTAINERS / f"{v}.Dockerfile" for v in ("lite", "gpu", "chatterbox")}


def compose(*files: str, **env: str) -> dict[str, Any]:
    return load([ROOT / f for f in files], env)


def test_compose_runs_what_make_run_runs_on_the_same_ports() -> None:
    model = compose("compose.yaml")
    services = model["services"]
    assert set(services) == {"redis", "asr", "tts", "gateway", "nginx"}
    assert services["nginx"]["profiles"] == ["nginx"]  # optional
    published = {name: services[name]["ports"] for name in ("gateway", "asr", "tts")}
    assert published == {
        "gateway": ["127.0.0.1:8000:8000"],
        "asr": ["127.0.0.1:8001:8001"],
        "tts": ["127.0.0.1:8002:8002"],
    }
    assert "ports" not in services["redis"]  # only the project's network reaches it
    for name in ("asr", "tts", "gateway"):
        svc = services[name]
        assert svc["image"] == f"{IMAGE}-lite"
        assert svc["command"] == [name]
        assert svc["build"]["dockerfile"] == "deploy/containers/lite.Dockerfile"
        assert svc["healthcheck"]["test"] == ["CMD", "python", "-m", "services.ops.healthcheck"]
        assert svc["environment"]["VA_REDIS__URL"] == "redis://redis:6379/0"
        assert svc["read_only"] and svc["cap_drop"] == ["ALL"]
    assert {dep: rule["condition"] for dep, rule in services["gateway"]["depends_on"].items()} == {
        "redis": "service_healthy",
        "asr": "service_healthy",
        "tts": "service_healthy",
    }
    for name in ("asr", "tts"):
        assert services[name]["depends_on"] == {"redis": {"condition": "service_healthy"}}
    assert services["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]


def test_compose_is_secure_by_default() -> None:
    """No way in without an API key: nothing turns authentication off, no secret is set."""
    for name in ("compose.yaml", "compose.gpu.yaml"):
        text = re.sub(r"#.*", "", (ROOT / name).read_text())
        assert "VA_AUTH__REQUIRED" not in text
        assert not re.search(r"(API_KEY|TOKEN_SECRET|PASSWORD|requirepass)\s*[:=]", text, re.I)


def test_published_ports_follow_the_variables() -> None:
    model = compose("compose.yaml", VOICE_AGENT_BIND="0.0.0.0", VOICE_AGENT_GATEWAY_PORT="9000")
    assert model["services"]["gateway"]["ports"] == ["0.0.0.0:9000:8000"]


def test_the_gpu_override_pins_asr_to_gpu_0_and_tts_to_gpu_1() -> None:
    services = compose("compose.yaml", "compose.gpu.yaml")["services"]
    for name, gpu, variant in (("asr", "0", "gpu"), ("tts", "1", "chatterbox")):
        svc = services[name]
        (device,) = svc["deploy"]["resources"]["reservations"]["devices"]
        assert device == {"driver": "nvidia", "device_ids": [gpu], "capabilities": ["gpu"]}
        assert svc["image"] == f"{IMAGE}-{variant}"
        assert svc["build"]["dockerfile"] == f"deploy/containers/{variant}.Dockerfile"
        assert svc["environment"]["VA_PROFILE"] == "dual-gpu"
        # the one GPU a container sees is its device 0
        key = "VA_ASR__WHISPER__GPU" if name == "asr" else "VA_TTS__CHATTERBOX__GPU"
        assert svc["environment"][key] == "0"
        assert svc["environment"]["VA_REDIS__URL"] == "redis://redis:6379/0"  # merged
        pull = services[f"models-{name}"]
        assert svc["depends_on"][f"models-{name}"] == {
            "condition": "service_completed_successfully"
        }
        assert pull["command"][:2] == ["models", "pull"] and pull["command"][2] in MODELS
        assert MODELS[pull["command"][2]].engine == name
        assert "models:/models:ro" in svc["volumes"] and "models:/models" in pull["volumes"]
    assert services["gateway"]["image"] == f"{IMAGE}-lite"


def test_compose_interpolation() -> None:
    env = {"A": "x", "EMPTY": ""}
    assert interpolate("${A}-${B:-d}-${EMPTY:-e}-${EMPTY-f}-$$A-$A", env) == "x-d-e--$A-x"
    with pytest.raises(ValueError, match="B"):
        interpolate("${B:?set B}", env)


def test_the_nginx_config_is_the_template_rendered_for_compose() -> None:
    site = NginxSite(
        gateways=("gateway:8000",),
        asr=("asr:8001",),
        tts=("tts:8002",),
        bind=("0.0.0.0",),
        user="nginx",
        pid_file=Path("/var/run/nginx.pid"),
        log_dir=Path("/var/log/nginx"),
        state_dir=Path("/var/cache/nginx"),
    )
    assert (CONTAINERS / "nginx.conf").read_text() == render_nginx(site)
    nginx = compose("compose.yaml")["services"]["nginx"]
    assert "./deploy/containers/nginx.conf:/etc/nginx/nginx.conf:ro" in nginx["volumes"]


def _pins(lock: Path) -> dict[str, set[str]]:
    """Name → pinned versions (a universal lock may pin one per Python, by markers)."""
    text = lock.read_text()
    pins = re.findall(r"^([a-z0-9][a-z0-9._-]*)==([^\s;\\]+)", text, re.M)
    entries = re.findall(
        r"^[a-z0-9][^\n]*\\\n((?:\s+--hash=sha256:[0-9a-f]{64}\s*\\?\n?)+)", text, re.M
    )
    assert len(entries) == len(pins), f"{lock.name}: every pin carries its hashes"
    found: dict[str, set[str]] = {}
    for name, version in pins:
        found.setdefault(re.sub(r"[-_.]+", "-", name), set()).add(version)
    return found


@pytest.mark.parametrize(("lock", "extras"), [("lite", ["lite"]), ("gpu", ["faster-whisper"])])
def test_locks_satisfy_pyproject(lock: str, extras: list[str]) -> None:
    pins = _pins(CONTAINERS / "requirements" / f"{lock}.txt")
    wanted = list(PROJECT["dependencies"])
    for extra in extras:
        wanted += PROJECT["optional-dependencies"][extra]
    for line in wanted:
        req = Requirement(line)
        name = re.sub(r"[-_.]+", "-", req.name.lower())
        assert name in pins, f"{lock}.txt lacks {req.name}"
        for version in pins[name]:
            assert req.specifier.contains(version), f"{lock}.txt: {name}=={version} vs {line}"


def test_chatterbox_pins() -> None:
    requirements = CONTAINERS / "requirements"
    assert _pins(requirements / "chatterbox-tts.txt") == {"chatterbox-tts": {"0.1.7"}}
    chatterbox = _pins(requirements / "chatterbox.txt")
    assert chatterbox["torch"] == {"2.6.0"}
    assert all(v.startswith("1.") for v in chatterbox["numpy"])
    # the watermarker needs pkg_resources
    assert all(int(v.split(".")[0]) < 81 for v in chatterbox["setuptools"])


@pytest.mark.parametrize("variant", DOCKERFILES)
def test_dockerfiles_are_multi_stage_non_root_and_labelled(variant: str) -> None:
    text = DOCKERFILES[variant].read_text()
    base = re.search(r"^ARG BASE=(\S+)$", text, re.M)
    assert base is not None and base.group(1).startswith("docker.io/"), "a public default base"
    assert len(re.findall(r"^FROM ", text, re.M)) >= 3
    assert "USER 10001:10001" in text
    assert 'CMD ["python", "-m", "services.ops.healthcheck"]' in text
    assert "--require-hashes" in text and "pip uninstall --yes --no-input pip" in text
    for label in ("source", "version", "revision", "licenses"):
        assert f"org.opencontainers.image.{label}=" in text
    # the host's pip settings only ever as build secrets, mounted for one step
    assert "type=secret,id=pip_env" in text and "COPY /etc/pip" not in text
    assert "pip.conf" not in re.sub(r"#.*", "", text)


def test_the_lite_image_says_piper_is_gpl() -> None:
    text = DOCKERFILES["lite"].read_text()
    licences = re.search(r'org.opencontainers.image.licenses="([^"]+)"', text)
    assert licences is not None and "GPL-3.0" in licences.group(1)
    assert "piper-tts" in text and "GPL-3.0" in (ROOT / "docs" / "containers.md").read_text()


def test_dockerignore_lets_in_only_what_the_images_need() -> None:
    lines = [
        line
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert lines[0] == "*"
    allowed = {line[1:] for line in lines if line.startswith("!")}
    assert allowed == {"pyproject.toml", "README.md", "services/", "deploy/containers/"}
    copied = set()
    for dockerfile in DOCKERFILES.values():
        copied |= set(re.findall(r"^COPY (?!--from)(\S+)", dockerfile.read_text(), re.M))
    for source in copied:
        assert any(source == a or source.startswith(a) for a in allowed), source


def test_the_lite_image_pulls_smart_turn_as_make_run_does() -> None:
    """The project's own `models pull smart-turn` (the wheel's SHA-256 pinned there), into
    the folder the gateway is told to read."""
    text = DOCKERFILES["lite"].read_text()
    assert "models pull smart-turn --dir /models" in text
    assert "COPY --from=smart-turn /models/ /opt/voice-agent/models/" in text
    assert "VA_GATEWAY__MODELS_DIR=/opt/voice-agent/models" in text


def test_the_container_benchmark_imports() -> None:
    import benchmarks.containers as bench

    assert callable(bench.main)


@pytest.mark.parametrize("files", [("compose.yaml",), ("compose.yaml", "compose.gpu.yaml")])
def test_uploaded_voices_go_to_a_volume(files: tuple[str, ...]) -> None:
    """The root filesystem is read-only: the TTS keeps uploaded clips on a named volume
    (POST /v1/voices was a 500 writing the default, relative `var/voices`)."""
    model = compose(*files)
    tts = model["services"]["tts"]
    folder = Path(tts["environment"]["VA_TTS__VOICES__DIR"])
    mounts = [str(v).split(":") for v in tts["volumes"]]
    named = {target: source for source, target, *_ in mounts if source in model["volumes"]}
    assert any(folder.is_relative_to(target) for target in named), (folder, named)
    home = "/var/lib/voice-agent"  # made by the Dockerfiles' useradd, owned by the user
    for dockerfile in DOCKERFILES.values():
        assert (
            f"--home-dir {home}" in dockerfile.read_text()
            and "--create-home" in dockerfile.read_text()
        )
    assert named.get(home) == "voices"
