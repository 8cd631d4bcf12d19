"""The containers a user runs, built from this checkout and run for real with podman.

1. compose.yaml: the lite image built by scripts/build_images.sh (as a user builds it),
   Redis, ASR, TTS and the gateway started in compose's order (tests/compose_runner.py:
   each after its dependencies' healthchecks pass), no credential refused, an API key made
   with `voice-agent keys create` inside the gateway container (as docs/containers.md says),
   a voice uploaded (onto the `voices` volume: the root filesystem is read-only), one
   spoken turn through /v1/stream (transcript and agent audio), a clean stop (every
   container exits 0 on SIGTERM).
2. The image's hygiene: non-root, HEALTHCHECK, labels, no pip, and none of the build
   host's pip settings or CA bundle (passed as build secrets) nor any private key in any
   layer or in the history.
3. The Helm chart's gateway, ASR and TTS Deployments for the lite profile, rendered by
   helm and run by `podman kube play`, each answering /ready.

Skipped, with the reason, only where podman cannot run. The first build takes minutes
(Debian base, then the image's dependencies); after that podman's layer cache keeps a
rebuild to seconds.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import websockets
import yaml
from websockets.exceptions import InvalidStatus

from services.client.stream import StreamClient
from services.ops.redis_server import free_port
from tests import containers
from tests.compose_runner import Project, load
from tests.speech import speak
from tests.unit.test_voices import voice_like, wav

QUESTION = "what is the weather like in paris today"
CHART = containers.REPO / "deploy" / "kubernetes" / "voice-agent"

pytestmark = [
    pytest.mark.skipif(
        containers.podman_problem() is not None, reason=str(containers.podman_problem())
    ),
    pytest.mark.timeout(containers.BUILD_TIMEOUT_S + 600),
]


@pytest.fixture(scope="module")
def built() -> dict[str, float]:
    """The images, built (or found in podman's cache) once for the module."""
    return containers.build_images()


@dataclass
class Stack:
    project: Project
    ports: dict[str, int]


@pytest.fixture
def stack(built: dict[str, float]) -> Iterator[Stack]:
    """compose.yaml as a project of its own, its ports published on free ones."""
    ports = {name: free_port() for name in ("gateway", "asr", "tts")}
    env = {
        "VOICE_AGENT_REDIS_IMAGE": containers.REDIS,
        "VOICE_AGENT_BIND": "127.0.0.1",
        **{f"VOICE_AGENT_{name.upper()}_PORT": str(port) for name, port in ports.items()},
    }
    model = load([containers.REPO / "compose.yaml"], env)
    name = f"va-test-{uuid.uuid4().hex[:8]}"
    project = Project(name, model, containers.REPO, containers.podman_env())
    try:
        yield Stack(project, ports)
    finally:
        project.down()


async def test_compose_stack_answers_one_spoken_turn(stack: Stack) -> None:
    project, ports = stack.project, stack.ports
    assert project.services["gateway"]["image"] == containers.image("lite")
    started = time.monotonic()
    healthy = project.up(timeout_s=300)
    print(f"start to ready: {time.monotonic() - started:.1f} s; healthy at {healthy}")
    assert set(healthy) == {"redis", "asr", "tts", "gateway"}
    url = f"ws://127.0.0.1:{ports['gateway']}/v1/stream"

    # secure by default: no credential, no service
    voices = httpx.get(f"http://127.0.0.1:{ports['tts']}/v1/voices", timeout=10)
    assert voices.status_code == 401, voices.text
    with pytest.raises(InvalidStatus) as refused:
        async with websockets.connect(url, open_timeout=10):
            pass
    assert refused.value.response.status_code == 401

    made = project.exec("gateway", "voice-agent", "keys", "create", "--tenant", "compose")
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    assert key.startswith("va_") and key not in made.stderr
    health = httpx.get(f"http://127.0.0.1:{ports['gateway']}/health", timeout=10).json()
    assert health["end_of_turn"] == "smart-turn", health  # the model the image carries

    # a voice upload: the root filesystem is read-only, the clips go to the `voices` volume
    uploaded = httpx.post(
        f"http://127.0.0.1:{ports['tts']}/v1/voices",
        files={"file": ("me.wav", wav(voice_like(5.0)), "audio/wav")},
        data={"name": "me"},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert uploaded.status_code == 201, uploaded.text

    audio = np.concatenate([speak(QUESTION, 16000), np.zeros(16000, np.float32)])
    async with StreamClient(url, api_key=key, open_timeout_s=20) as client:
        received = client.new_turn()
        await client.speak(audio, 16000)
        done = await client.silence_until("response.done", 60)
    finals = [event["text"] for event in received.of_type("transcript.final")]
    assert len(finals) == 1 and {"weather", "paris"} & set(re.findall(r"[a-z]+", finals[0].lower()))
    assert done["status"] == "completed", done
    assert len(received.audio) / 2 / client.output_rate > 0.5  # agent audio came back

    # SIGTERM, as `docker compose stop` sends it: each service shuts down by itself within
    # its grace period (143: uvicorn re-raises the SIGTERM it handled, behind the init; 137
    # would be a SIGKILL after the grace period)
    codes = project.stop()
    assert set(codes.values()) <= {0, 143} and codes["redis"] == 0, codes
    for name in ("gateway", "asr", "tts"):
        assert "Application shutdown complete" in project.logs(name), name


def _image_config(image: str) -> dict[str, Any]:
    shown = containers.podman("image", "inspect", image)
    assert shown.returncode == 0, shown.stderr
    config: dict[str, Any] = json.loads(shown.stdout)[0]
    return config


def test_lite_image_runs_as_a_user_with_a_healthcheck_and_labels(built: dict[str, float]) -> None:
    config = _image_config(containers.image("lite"))
    assert config["Config"]["User"] == "10001:10001"
    assert "services.ops.healthcheck" in " ".join(config["Healthcheck"]["Test"])
    assert config["Config"]["Entrypoint"] == ["voice-agent"]
    # the build's pip settings were secrets of one step, not the image's environment
    assert not [e for e in config["Config"]["Env"] if e.startswith(("PIP_", "VA_AUTH__"))]
    labels = config["Config"]["Labels"]
    assert labels["org.opencontainers.image.version"] == containers.version()
    assert "GPL-3.0" in labels["org.opencontainers.image.licenses"]
    assert labels["org.opencontainers.image.source"].startswith("https://")
    find_pip = "import importlib.util as u; print(u.find_spec('pip'))"
    listed = containers.podman(
        "run", "--rm", "--entrypoint", "python", containers.image("lite"), "-c", find_pip
    )  # fmt: skip
    assert listed.stdout.strip() == "None", listed.stdout + listed.stderr


def _host_pip_settings() -> tuple[list[bytes], list[str]]:
    """What scripts/build_images.sh passes to a build from this host: the CA bundle pip
    trusts (its bytes) and the index URLs (which may carry credentials)."""
    listed = subprocess.run(
        ["python3", "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    settings = dict(line.split("=", 1) for line in listed.splitlines() if "=" in line)
    settings = {k.split(".", 1)[-1]: v.strip("'\"") for k, v in settings.items()}
    bundles = {settings.get("cert", ""), os.environ.get("PIP_CERT", "")}
    contents = [Path(b).read_bytes() for b in bundles if b and Path(b).is_file()]
    urls = [settings.get(k, "") for k in ("index-url", "extra-index-url")]
    urls += [os.environ.get(k, "") for k in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")]
    return contents, [u for url in urls for u in url.split() if u.startswith("http")]


def test_no_build_secret_or_private_key_in_any_layer(
    built: dict[str, float], tmp_path: Path
) -> None:
    archive = tmp_path / "image.tar"
    saved = containers.podman(
        "save", "--format", "docker-archive", "-o", str(archive), containers.image("lite"),
        timeout=600,
    )  # fmt: skip
    assert saved.returncode == 0, saved.stderr
    bundles, urls = _host_pip_settings()
    secrets = {hashlib.sha256(bundle).hexdigest() for bundle in bundles}
    # a PEM private key with its body (libraries that parse keys hold the header alone)
    private_key = re.compile(
        rb"-----BEGIN (?:RSA |EC |DSA |OPENSSH |ENCRYPTED )?PRIVATE KEY-----\r?\n"
        rb"[A-Za-z0-9+/=:, \r\n-]{40,}?-----END"
    )
    # keys are looked for in files, not in compiled libraries (libgnutls, in Debian's base
    # layer and in av's wheel, carries its FIPS self-test keys); the base layer is Debian's
    base = {d.split(":")[-1] for d in _image_config(containers.BASE)["RootFS"]["Layers"]}
    found = []
    try:
        with tarfile.open(archive) as outer:
            layers = [m for m in outer.getmembers() if m.name.endswith(".tar")]
            assert layers, "no layer in the saved image"
            for member in layers:
                stream = outer.extractfile(member)
                assert stream is not None
                with tarfile.open(fileobj=stream, mode="r|") as layer:
                    for entry in layer:
                        if entry.name.startswith(("run/secrets", "./run/secrets")):
                            found.append(f"{member.name}: {entry.name}")
                        if not entry.isfile() or entry.size > 50_000_000:
                            continue
                        data = layer.extractfile(entry).read()  # type: ignore[union-attr]
                        ours = Path(member.name).stem not in base and data[:4] != b"\x7fELF"
                        if hashlib.sha256(data).hexdigest() in secrets or (
                            ours and private_key.search(data)
                        ):
                            found.append(f"{member.name}: {entry.name}")
    finally:
        archive.unlink()  # about a gigabyte
    assert found == []
    history = containers.podman("history", "--no-trunc", containers.image("lite")).stdout
    assert [url for url in urls if url in history] == []


def helm() -> str:
    found = containers.REPO / ".venv" / "k8s-tools" / "helm"
    path = str(found) if found.is_file() else shutil.which("helm")
    if path is None:
        pytest.skip("no helm: run scripts/k8s_tools.sh (make test does)")
    return path


_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def as_kubelet_would(deployment: dict[str, Any]) -> dict[str, Any]:
    """What a kubelet does and podman 4.3's `kube play` does not: expand `$(VAR)` in env
    values from the variables defined before them, `metadata.name` from the downward API
    included (podman names the pod `<deployment>-pod-0`)."""
    pod_name = f"{deployment['metadata']['name']}-pod-0"
    for container in deployment["spec"]["template"]["spec"]["containers"]:
        known: dict[str, str] = {}
        for env in container.get("env", []):
            field = env.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            if field == "metadata.name":
                known[env["name"]] = pod_name
            elif "value" in env:
                env["value"] = _REFERENCE.sub(lambda m, k=known: k.get(m[1], m[0]), env["value"])
                known[env["name"]] = env["value"]
    return deployment


def test_chart_lite_deployments_run_under_podman_kube_play(
    built: dict[str, float], tmp_path: Path
) -> None:
    """The chart's own manifests (profile lite, the image built above), not a copy of them.

    What podman cannot run is left out and said here: Services, Ingress, HPA and PDB are
    cluster objects with no podman counterpart; the probes become podman healthchecks that
    nothing schedules without systemd (and podman 4.3 writes a named port as port 0), so
    readiness is asked over HTTP as the kubelet would; the preStop drain is not run by
    podman (tests/e2e/test_drain.py covers it); the Secret is created as the JSON podman 4.3
    reads (its own `kind: Secret` support stores a form its secretKeyRef cannot read); and
    `$(POD_NAME)` is expanded as the kubelet would (as_kubelet_would).
    """
    release = f"t{uuid.uuid4().hex[:6]}"
    rendered = subprocess.run(
        [helm(), "template", release, str(CHART), "--set", "profile=lite",
         "--set", f"redis.existingSecret={release}-redis"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    docs = [doc for doc in yaml.safe_load_all(rendered) if doc]
    deployments = [as_kubelet_would(doc) for doc in docs if doc["kind"] == "Deployment"]
    assert {d["metadata"]["labels"]["app.kubernetes.io/component"] for d in deployments} == {
        "gateway", "asr", "tts",
    }  # fmt: skip
    for doc in deployments:
        for container in doc["spec"]["template"]["spec"]["containers"]:
            assert container["image"] == containers.image("lite")
    manifest = tmp_path / "deployments.yaml"
    manifest.write_text(yaml.safe_dump_all(deployments))
    network, redis = f"{release}-net", f"{release}-redis"
    secret = tmp_path / "secret.json"
    url = base64.b64encode(b"redis://redis:6379/0").decode()
    secret.write_text(json.dumps({"VA_REDIS__URL": url}))
    try:
        for args in (
            ("network", "create", network),
            ("secret", "create", f"{release}-redis", str(secret)),
            ("run", "-d", "--name", redis, "--network", network, "--network-alias", "redis",
             containers.REDIS, "redis-server", "--protected-mode", "no"),
            ("kube", "play", "--start=false", "--network", network, str(manifest)),
        ):  # fmt: skip
            done = containers.podman(*args)
            assert done.returncode == 0, (args, done.stderr)
        for doc in deployments:  # one pod at a time: see _start_pod
            _start_pod(f"{doc['metadata']['name']}-pod-0")
        for doc in deployments:
            _wait_ready(doc, deadline=time.monotonic() + 240)
    finally:
        containers.podman("kube", "down", str(manifest), timeout=180)
        containers.podman("rm", "-f", "-t", "5", redis)
        containers.podman("secret", "rm", f"{release}-redis")
        containers.podman("network", "rm", "-f", network)


def _start_pod(pod: str) -> None:
    """Start one pod of `kube play --start=false` (its infra container first, then the
    app's). `kube play` starts every pod's containers at once, and once in some twenty
    fresh-clone runs on a busy 2-core machine podman 4.3 failed them all with "container
    state improper" and nothing else to go on; started one pod at a time, and told what
    podman saw when a start fails."""
    done = containers.podman("pod", "start", pod, timeout=180)
    assert done.returncode == 0, f"podman pod start {pod}: {done.stderr}\n{_podman_saw(pod)}"


def _podman_saw(pod: str) -> str:
    """The pod's containers as podman sees them: state, error, exit code and log tail."""
    listed = containers.podman(
        "ps", "-a", "--filter", f"pod={pod}", "--format", "{{.Names}}"
    ).stdout.split()
    lines = []
    for name in listed:
        state = containers.podman(
            "inspect", "--format", "{{.State.Status}} exit={{.State.ExitCode}} "
            "error={{.State.Error}}", name,
        ).stdout.strip()  # fmt: skip
        logs = containers.podman("logs", name)
        lines.append(f"{name}: {state}\n{(logs.stdout + logs.stderr)[-1500:]}")
    return "\n".join(lines) or f"no containers in pod {pod}"


def _wait_ready(deployment: dict[str, Any], deadline: float) -> None:
    """Until the pod's container answers /ready on its port, as a readiness probe asks."""
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert spec["securityContext"]["runAsUser"] == 10001
    name = f"{deployment['metadata']['name']}-pod-0-{container['name']}"
    port = container["ports"][0]["containerPort"]
    while True:
        shown = containers.podman("inspect", name)
        assert shown.returncode == 0, shown.stderr
        state = json.loads(shown.stdout)[0]
        assert state["Config"]["User"].startswith("10001"), state["Config"]["User"]
        networks = state["NetworkSettings"]["Networks"]
        address = next(iter(networks.values()))["IPAddress"]
        try:
            if httpx.get(f"http://{address}:{port}/ready", timeout=3).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            logs = containers.podman("logs", name).stderr[-3000:]
            raise AssertionError(f"{name} not ready on {address}:{port}:\n{logs}")
        time.sleep(1)  # a readiness probe's period
