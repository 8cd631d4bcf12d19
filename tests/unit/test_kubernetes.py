"""The Helm chart in deploy/kubernetes: rendered by a real helm (scripts/k8s_tools.sh),
validated against the Kubernetes JSON schemas (kubernetes-validate, strict), and checked for
the properties that matter: probes, the preStop drain, GPUs, the Redis Secret, ingress
timeouts, the PDB and the HPA."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from pydantic import BaseModel

from services.asr.settings import AsrSection, AsrSettings
from services.common.service.settings import BaseServiceSettings
from services.gateway.drain import stop_budget_s
from services.gateway.settings import GatewaySettings
from services.ops.cli import parser as cli_parser
from services.ops.deploy import NginxSite
from services.ops.models import MODELS
from services.tts.settings import TtsSettings
from tests.unit.test_deploy import page_fetches

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "kubernetes" / "voice-agent"
SENTINEL_URL = "redis+sentinel://h1:26379,h2:26379/mymaster/0"
MIN_VERSION = "1.25.0"  # Chart.yaml kubeVersion
SETTINGS: dict[str, type[BaseServiceSettings]] = {
    "gateway": GatewaySettings,
    "asr": AsrSettings,
    "tts": TtsSettings,
}
VALUE_SETS = {
    "defaults": ["redis.existingSecret=redis-url"],
    "sessions-hpa, secret from url": [
        f"redis.url={SENTINEL_URL}",
        "gateway.autoscaling.metric=sessions",
    ],
    "no autoscaling, no pvc, no ingress": [
        "redis.existingSecret=redis-url",
        "gateway.autoscaling.enabled=false",
        "models.persistence.enabled=false",
        "ingress.enabled=false",
        "gateway.pdb.enabled=false",
    ],
    "lite profile (CPU)": ["redis.existingSecret=redis-url", "profile=lite"],
    "gateway only, existing claim": [
        "redis.existingSecret=redis-url",
        "asr.enabled=false",
        "tts.enabled=false",
        "models.persistence.existingClaim=weights",
    ],
}


def helm() -> str:
    found = ROOT / ".venv" / "k8s-tools" / "helm"
    path = str(found) if found.is_file() else shutil.which("helm")
    if path is None:
        pytest.skip("no helm: run scripts/k8s_tools.sh (make test does)")
    return path


def render(*values: str) -> list[dict[str, Any]]:
    args = [helm(), "template", "va", str(CHART)]
    for value in values:
        args += ["--set-literal" if "," in value else "--set", value]  # a Sentinel URL has commas
    out = subprocess.run(args, check=True, capture_output=True, text=True, timeout=60).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def containers(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    spec = doc["spec"]["template"]["spec"]
    yield from spec.get("initContainers", [])
    yield from spec["containers"]


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
@pytest.mark.parametrize("version", [MIN_VERSION, kubernetes_validate.latest_version()])
def test_rendered_manifests_validate(values: list[str], version: str) -> None:
    docs = render(*values)
    errors = []
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message}")
    assert errors == []
    assert len(docs) >= 3


def test_helm_lint_passes() -> None:
    lint = subprocess.run(
        [helm(), "lint", str(CHART), "--strict", "--set", "redis.existingSecret=r"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_redis_url_is_required() -> None:
    run = subprocess.run(
        [helm(), "template", "va", str(CHART)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode != 0
    assert "set redis.existingSecret" in run.stderr


def test_gateway_readiness_and_prestop_drain() -> None:
    docs = render("redis.existingSecret=redis-url", "gateway.drain.graceS=45")
    pod = find(docs, "Deployment", "va-voice-agent-gateway")["spec"]["template"]["spec"]
    (gateway,) = pod["containers"]
    assert gateway["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/health"
    command = gateway["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["voice-agent", "drain"]
    args = cli_parser().parse_args(command[1:])  # the CLI really takes these arguments
    assert args.url == "http://127.0.0.1:8000" and args.grace == 45 and args.wait == 10
    # the kubelet waits for the preStop drain and for SIGTERM's whole stop before it kills
    shutdown = float(env_of(gateway)["VA_GATEWAY__SERVER__DRAIN_TIMEOUT_S"])
    assert pod["terminationGracePeriodSeconds"] > args.grace + args.wait + stop_budget_s(shutdown)
    assert env_of(gateway)["VA_GATEWAY__GATEWAY_ID"] == "gw-$(POD_NAME)"


@pytest.mark.parametrize(("name", "model"), [("asr", "large-v3-turbo"), ("tts", "chatterbox")])
def test_engines_request_one_gpu_and_pull_their_models(name: str, model: str) -> None:
    docs = render("redis.existingSecret=redis-url")
    doc = find(docs, "Deployment", f"va-voice-agent-{name}")
    pod = doc["spec"]["template"]["spec"]
    (engine,) = pod["containers"]
    assert engine["resources"]["requests"]["nvidia.com/gpu"] == 1
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert doc["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0  # no spare GPU assumed
    (pull,) = pod["initContainers"]
    args = cli_parser().parse_args(pull["command"][1:])
    assert (args.models_command, args.dir) == ("pull", "/models")
    assert args.name in MODELS and MODELS[args.name].engine == name
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "va-voice-agent-models"
    assert (
        env_of(engine)[f"VA_{name.upper()}__{'WHISPER' if name == 'asr' else 'CHATTERBOX'}__MODEL"]
        == model
    )


def test_redis_url_comes_from_the_secret_and_is_passed_through() -> None:
    docs = render(f"redis.url={SENTINEL_URL}")
    secret = find(docs, "Secret", "va-voice-agent-redis")
    assert secret["stringData"] == {"VA_REDIS__URL": SENTINEL_URL}
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    assert len(deployments) == 3
    for doc in deployments:
        for container in doc["spec"]["template"]["spec"]["containers"]:
            ref = env_of(container)["VA_REDIS__URL"]
            assert ref == {"secretKeyRef": {"name": "va-voice-agent-redis", "key": "VA_REDIS__URL"}}
    existing = render("redis.existingSecret=managed-redis", "redis.secretKey=url")
    assert not [d for d in existing if d["kind"] == "Secret"]
    gateway = find(existing, "Deployment", "va-voice-agent-gateway")
    (container,) = gateway["spec"]["template"]["spec"]["containers"]
    assert env_of(container)["VA_REDIS__URL"]["secretKeyRef"] == {
        "name": "managed-redis",
        "key": "url",
    }


def test_every_va_setting_the_chart_sets_exists() -> None:
    docs = render("redis.existingSecret=redis-url")
    for doc in (d for d in docs if d["kind"] == "Deployment"):
        settings = SETTINGS[doc["metadata"]["labels"]["app.kubernetes.io/component"]]
        for container in doc["spec"]["template"]["spec"]["containers"]:
            for name in env_of(container):
                if name.startswith("VA_"):
                    assert _has_field(settings, name.removeprefix("VA_").lower().split("__")), name


def _has_field(model: type[BaseModel], path: list[str]) -> bool:
    field = model.model_fields.get(path[0])
    if field is None:
        return False
    if len(path) == 1:
        return True
    inner = field.annotation
    return isinstance(inner, type) and issubclass(inner, BaseModel) and _has_field(inner, path[1:])


def test_ingress_keeps_websockets_open_and_routes_like_nginx() -> None:
    docs = render("redis.existingSecret=redis-url")
    ingress = find(docs, "Ingress", "va-voice-agent")
    notes = ingress["metadata"]["annotations"]
    for key in ("proxy-read-timeout", "proxy-send-timeout"):
        assert int(notes[f"nginx.ingress.kubernetes.io/{key}"]) >= 3600
    paths = {
        p["path"]: p["backend"]["service"]["name"]
        for p in ingress["spec"]["rules"][0]["http"]["paths"]
    }
    kinds = {p["path"]: p["pathType"] for p in ingress["spec"]["rules"][0]["http"]["paths"]}
    gateway_routes = {
        "/v1/stream": "Exact",
        "/v1/realtime": "Exact",
        "/v1/twilio": "Exact",
        "/v1/sessions": "Exact",
        "/": "Exact",
        "/static": "Prefix",
        "/v1/agents": "Exact",  # the browser page's agent list
        "/health": "Exact",
        "/ready": "Exact",
    }
    for path, kind in gateway_routes.items():
        assert (paths[path], kinds[path]) == ("va-voice-agent-gateway", kind), path
    assert paths["/v1/stream/asr"] == "va-voice-agent-asr"
    assert paths["/v1/audio/speech"] == paths["/v1/voices"] == "va-voice-agent-tts"
    assert paths["/v1/audio/translations"] == paths["/v1/models"] == "va-voice-agent-asr"
    assert ingress["spec"]["tls"][0]["secretName"] == "voice-agent-tls"
    # Above the ASR's upload limit: a file at the limit plus its multipart overhead
    # reaches the ASR (a typed 413), as deploy/nginx's client_max_body_size.
    body = notes["nginx.ingress.kubernetes.io/proxy-body-size"]
    assert int(body.removesuffix("m")) > AsrSection.model_fields["max_upload_mb"].default
    assert body == f"{NginxSite().max_body_mb}m"


@pytest.mark.parametrize("engines", ["true", "false"])
def test_ingress_routes_every_path_the_browser_page_fetches(engines: str) -> None:
    """`GET /v1/agents` (the page's agent list) used to match no path (`/` is Exact)."""
    docs = render("redis.existingSecret=redis-url", f"ingress.exposeEngines={engines}")
    ingress = find(docs, "Ingress", "va-voice-agent")
    routes = [(p["path"], p["pathType"]) for p in ingress["spec"]["rules"][0]["http"]["paths"]]
    fetched = page_fetches()
    assert "/v1/agents" in fetched
    for path in fetched:
        assert any(
            path == route or (kind == "Prefix" and path.startswith(route.rstrip("/") + "/"))
            for route, kind in routes
        ), path


def test_ingress_without_engines_sends_the_voice_list_to_the_gateways() -> None:
    docs = render("redis.existingSecret=redis-url", "ingress.exposeEngines=false")
    ingress = find(docs, "Ingress", "va-voice-agent")
    paths = {
        p["path"]: p["backend"]["service"]["name"]
        for p in ingress["spec"]["rules"][0]["http"]["paths"]
    }
    assert set(paths.values()) == {"va-voice-agent-gateway"}
    assert "/v1/voices" in paths and "/v1/twilio" in paths and "/v1/agents" in paths


def test_pdb_and_hpa_select_the_gateways() -> None:
    docs = render("redis.existingSecret=redis-url", "gateway.autoscaling.metric=sessions")
    gateway = find(docs, "Deployment", "va-voice-agent-gateway")
    labels = gateway["spec"]["template"]["metadata"]["labels"]
    pdb = find(docs, "PodDisruptionBudget", "va-voice-agent-gateway")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert "replicas" not in gateway["spec"]  # the HPA owns the count
    hpa = find(docs, "HorizontalPodAutoscaler", "va-voice-agent-gateway")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "va-voice-agent-gateway"
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == "va_gateway_sessions_active"
    assert metric["pods"]["target"]["averageValue"] == "60"
    assert hpa["spec"]["behavior"]["scaleDown"]["policies"] == [
        {"type": "Pods", "value": 1, "periodSeconds": 300}
    ]
    cpu = find(
        render("redis.existingSecret=r"), "HorizontalPodAutoscaler", "va-voice-agent-gateway"
    )
    assert cpu["spec"]["metrics"][0]["resource"]["name"] == "cpu"


def test_the_gateway_gauge_the_hpa_reads_exists() -> None:
    from services.gateway import metrics

    assert metrics.SESSIONS._name == "va_gateway_sessions_active"


def test_default_images_are_the_ones_scripts_build_images_builds() -> None:
    """<repository>:<appVersion>-<variant> (docs/containers.md): lite for the gateway, gpu
    for the ASR and chatterbox for the TTS on dual-gpu, lite for all three on lite."""
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    repo = "ghcr.io/voice-agent/voice-agent"
    for profile, variants in (
        ("dual-gpu", {"gateway": "lite", "asr": "gpu", "tts": "chatterbox"}),
        ("lite", {"gateway": "lite", "asr": "lite", "tts": "lite"}),
    ):
        docs = render("redis.existingSecret=r", f"profile={profile}")
        for name, variant in variants.items():
            deployment = find(docs, "Deployment", f"va-voice-agent-{name}")
            for container in containers(deployment):
                assert container["image"] == f"{repo}:{version}-{variant}", (profile, name)
    own = render("redis.existingSecret=r", "image.repository=reg.example/va", "tts.image.tag=x")
    assert next(containers(find(own, "Deployment", "va-voice-agent-tts")))["image"] == (
        "reg.example/va:x"
    )


def test_lite_profile_runs_the_engines_on_the_cpu() -> None:
    docs = render("redis.existingSecret=r", "profile=lite")
    assert not [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    for name in ("asr", "tts"):
        spec = find(docs, "Deployment", f"va-voice-agent-{name}")["spec"]["template"]["spec"]
        assert "initContainers" not in spec and "volumes" not in spec
        assert "nodeSelector" not in spec and "tolerations" not in spec
        (container,) = spec["containers"]
        resources = container["resources"]
        assert "nvidia.com/gpu" not in {**resources["requests"], **resources.get("limits", {})}
        env = env_of(container)
        assert env["VA_PROFILE"] == "lite" and not [k for k in env if "__GPU" in k]
