"""The checks of `voice-agent doctor` (services/ops/doctor.py): each returns a `Check`.

GPUs (NVML), the configured engines and their model folders, the gateway's end-of-turn
model, Redis, the services' ports, and nginx (`nginx -t` on the shipped template rendered
for this host).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import httpx
import redis
from redis.sentinel import Sentinel

from services.asr.settings import AsrSettings, WhisperSettings
from services.common.bus.connection import parse_url
from services.common.errors import EngineUnavailable
from services.common.platform import gpu
from services.common.platform.packaged import PackagedModel, SplitModel
from services.common.redact import redact_url
from services.common.service.settings import BaseServiceSettings
from services.duplex.settings import DuplexSettings
from services.gateway.settings import GatewaySection
from services.ops.deploy import (
    NginxSite,
    check_nginx,
    nginx_binary,
    prepare_dirs,
    render_nginx,
)
from services.ops.healthcheck import host_port, reachable_host
from services.ops.redis_server import reachable
from services.tts.settings import PiperSettings, TtsSettings

Status = Literal["OK", "WARN", "FAIL"]
LITE = "pip install 'voice-agent[lite]'"
MOSHI_ENGINES = ("moshi", "moshi-random")
"""The duplex engines that need torch and moshi (and a GPU, unless set to the CPU)."""


@dataclass(frozen=True)
class Check:
    """One finding: what was checked, how it went, and the fix when it is not OK."""

    name: str
    status: Status
    detail: str
    fix: str = ""


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def _physical(gpu_setting: int | None, device_index: int) -> int:
    """The physical GPU a service will use, as seen from a shell without CUDA_VISIBLE_DEVICES."""
    return device_index if gpu_setting is None else gpu_setting


def _wanted_gpus(services: Sequence[BaseServiceSettings]) -> dict[str, tuple[str, int]]:
    """service → (device setting, physical GPU) for each service set to use a GPU."""
    wanted: dict[str, tuple[str, int]] = {}
    for settings in services:
        if isinstance(settings, AsrSettings) and settings.asr.engine == "faster-whisper":
            whisper = settings.asr.whisper
            wanted["asr"] = (whisper.device, _physical(whisper.gpu, whisper.device_index))
        if isinstance(settings, TtsSettings) and settings.tts.engine == "chatterbox":
            box = settings.tts.chatterbox
            wanted["tts"] = (box.device, _physical(box.gpu, box.device_index))
        if isinstance(settings, DuplexSettings) and settings.duplex.engine in MOSHI_ENGINES:
            moshi = settings.duplex.moshi
            wanted["duplex"] = (moshi.device, _physical(moshi.gpu, moshi.device_index))
    return {name: want for name, want in wanted.items() if want[0] != "cpu"}


def check_gpus(*services: BaseServiceSettings) -> Check:
    """GPUs NVML sees, against the GPUs the engines of `services` are set to use."""
    wanted = _wanted_gpus(services)
    count = gpu.gpu_count()
    smi = "nvidia-smi found" if shutil.which("nvidia-smi") else "no nvidia-smi"
    if count == 0:
        reason = gpu.gpu_report(0, env={}).get("reason", "")
        must = sorted(s for s, (device, _) in wanted.items() if device == "cuda")
        if must:
            return Check(
                "gpu",
                "FAIL",
                f"no GPU visible ({reason}; {smi}) but {', '.join(must)} must run on CUDA",
                "install the NVIDIA driver until nvidia-smi lists the GPUs, or run on CPU: "
                "VA_PROFILE=lite (embedded engines) or VA_ASR__WHISPER__DEVICE=cpu",
            )
        if wanted:
            return Check("gpu", "WARN", f"no GPU ({reason}): {', '.join(wanted)} will use the CPU")
        return Check("gpu", "OK", f"no GPU, and none needed (CPU engines; {smi})")
    gpus = [gpu.gpu_report(i, env={}) for i in range(count)]
    listed = ", ".join(f"{g['id']} {g['name']} ({_gib(g['memory_total'])})" for g in gpus)
    missing = {s: p for s, (_, p) in wanted.items() if p >= count}
    if missing:
        names = ", ".join(f"{s} wants GPU {p}" for s, p in sorted(missing.items()))
        return Check(
            "gpu",
            "FAIL",
            f"{count} GPU(s): {listed}; {names}",
            "set VA_ASR__WHISPER__GPU / VA_TTS__CHATTERBOX__GPU / VA_DUPLEX__MOSHI__GPU to GPUs "
            "this host has "
            "(and CUDA_VISIBLE_DEVICES in the units: docs/deployment.md)",
        )
    return Check("gpu", "OK", f"{count} GPU(s): {listed}; {smi}")


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def check_asr_model(settings: AsrSettings) -> Check:
    """The configured ASR engine is installed and the folder of every model it loads at
    start (the default, and `models.preload`) is complete."""
    section = settings.asr
    if section.engine == "fake":
        return Check("model asr", "OK", "the fake engine (no model)")
    if section.engine != "faster-whisper":
        return Check("model asr", "FAIL", f"unknown engine {section.engine!r}", "VA_ASR__ENGINE")
    names = dict.fromkeys([section.whisper.model, *section.models.preload])
    checks = [_whisper_model(section.whisper.model_copy(update={"model": n})) for n in names]
    for status in ("FAIL", "WARN"):
        if (worst := next((c for c in checks if c.status == status), None)) is not None:
            return worst
    return Check("model asr", "OK", "; ".join(check.detail for check in checks))


def _whisper_model(whisper: WhisperSettings) -> Check:
    """One faster-whisper model: packaged (checked), or a complete folder."""
    from services.asr.engines.catalog import PACKAGED
    from services.asr.engines.whisper_files import resolve_model_dir

    folder = resolve_model_dir(whisper)
    packaged = PACKAGED.get(whisper.model)
    if packaged is not None and not folder.is_dir():
        return _packaged("model asr", packaged)
    pull = f"voice-agent models pull faster-whisper-{whisper.model} --dir {whisper.models_dir}"
    if not _installed("faster_whisper"):
        fix = "pip install 'voice-agent[faster-whisper]'"
        return Check("model asr", "FAIL", "faster-whisper missing", fix)
    folder = folder.absolute()
    missing = [n for n in ("model.bin", "tokenizer.json") if not (folder / n).is_file()]
    if not folder.is_dir() and whisper.allow_download:
        return Check("model asr", "WARN", f"no model at {folder}: downloads at start-up", pull)
    if missing:
        return Check("model asr", "FAIL", f"{folder}: missing {', '.join(missing)}", pull)
    return Check("model asr", "OK", f"faster-whisper model at {folder}")


def duplex_python() -> Path | None:
    """The duplex service's own interpreter (`make install-duplex`: torch and moshi), when
    there is one; `voice-agent up` runs the service on it, else on this one."""
    own = Path(os.environ.get("VENV_DUPLEX", ".venv-duplex")) / "bin" / "python"
    return own if own.exists() else None


def check_duplex_model(settings: DuplexSettings) -> Check:
    """The duplex engine can be imported where `up` runs it, and its checkpoint is complete."""
    section = settings.duplex
    if section.engine == "fake":
        return Check("model duplex", "OK", "the fake engine (no model)")
    if section.engine not in MOSHI_ENGINES:
        fix = f"VA_DUPLEX__ENGINE: one of fake, {', '.join(MOSHI_ENGINES)}"
        return Check("model duplex", "FAIL", f"unknown engine {section.engine!r}", fix)
    python = duplex_python()
    if python is None:
        where, importable = "this environment", _installed("torch") and _installed("moshi")
    else:
        where, importable = str(python.parent.parent), _importable_in(python, "moshi.models")
    if not importable:
        fix = "make install-duplex (docs/duplex.md)"
        return Check("model duplex", "FAIL", f"torch and moshi are not importable in {where}", fix)
    if section.engine == "moshi-random":
        return Check("model duplex", "OK", f"moshi-random (random weights, no model; {where})")
    from services.duplex.engines.moshi import model_folder
    from services.ops.models import MODELS

    moshi = section.moshi
    try:
        folder = model_folder(moshi).absolute()
    except EngineUnavailable as exc:
        return Check("model duplex", "FAIL", str(exc), "VA_DUPLEX__MOSHI__MODEL")
    spec = MODELS.get(moshi.model, MODELS["moshiko-pytorch-bf16"])
    missing = [name for name in spec.required() if not (folder / name).is_file()]
    if missing:
        pull = f"voice-agent models pull {moshi.model} --dir {moshi.models_dir}"
        return Check("model duplex", "FAIL", f"{folder}: missing {', '.join(missing)}", pull)
    return Check("model duplex", "OK", f"Moshi model at {folder} ({where})")


def check_end_of_turn(section: GatewaySection) -> Check:
    """The gateway's end-of-turn policy: `auto` quietly falls back to the silence rule
    (slower: it waits out the whole fallback pause) when Smart Turn is not installed."""
    from services.gateway.smart_turn import available

    name = section.end_of_turn
    if name not in ("auto", "smart-turn"):
        return Check("end of turn", "OK", f"the {name} policy")
    folder = section.models_dir.absolute()
    if available(section.models_dir):
        return Check("end of turn", "OK", f"{name}: Smart Turn (in {folder} or its wheel)")
    fix = (
        f"voice-agent models pull smart-turn --dir {folder} (VA_GATEWAY__MODELS_DIR names "
        "the folder), or choose a policy: VA_GATEWAY__END_OF_TURN"
    )
    if name == "smart-turn":
        return Check("end of turn", "FAIL", f"no Smart Turn model in {folder}", fix)
    detail = f"auto resolves to silence (slower turns): no Smart Turn model in {folder}"
    return Check("end of turn", "WARN", detail, fix)


def _importable_in(python: Path, module: str) -> bool:
    """Whether the interpreter `python` can import `module`."""
    if not python.exists():
        return False
    done = subprocess.run(
        [str(python), "-c", f"import {module}"], capture_output=True, timeout=120, check=False
    )
    return done.returncode == 0


def check_tts_model(settings: TtsSettings, tts_venv: Path | None = None) -> Check:
    """The configured TTS engine is installed and its model folder is complete."""
    section = settings.tts
    if section.engine == "piper":
        return _piper(section.piper)
    if section.engine == "espeak":
        if _installed("espeakng_loader"):
            return Check("model tts", "OK", "espeak-ng (bundled by espeakng-loader)")
        return Check("model tts", "FAIL", "espeakng-loader missing", LITE)
    if section.engine == "fake":
        return Check("model tts", "OK", "the fake engine (no model)")
    if section.engine != "chatterbox":
        return Check("model tts", "FAIL", f"unknown engine {section.engine!r}", "VA_TTS__ENGINE")
    from services.tts.engines.chatterbox import REQUIRED_FILES, ChatterboxEngine

    folder = ChatterboxEngine(section.chatterbox).model_folder().absolute()
    pull = f"voice-agent models pull chatterbox --dir {section.chatterbox.models_dir}"
    missing = [n for n in REQUIRED_FILES if not (folder / n).is_file()]
    if missing and not (section.chatterbox.allow_download and not folder.is_dir()):
        return Check("model tts", "FAIL", f"{folder}: missing {', '.join(missing)}", pull)
    if _installed("chatterbox"):
        where = "here"
    elif tts_venv is not None:
        if not _importable_in(tts_venv / "bin" / "python", "chatterbox.tts"):
            fix = "create the TTS environment (docs/deployment.md)"
            return Check("model tts", "FAIL", f"chatterbox not importable in {tts_venv}", fix)
        where = str(tts_venv)
    else:
        detail = f"model at {folder}; chatterbox is not installed in this environment"
        return Check("model tts", "WARN", detail, "pass --tts-venv DIR to check the TTS one")
    state = "downloads at start-up" if missing else f"model at {folder}"
    return Check("model tts", "WARN" if missing else "OK", f"chatterbox ({where}); {state}")


def _packaged(name: str, model: PackagedModel | SplitModel) -> Check:
    """A model that comes in a wheel: installed, the pinned version, every file's SHA-256."""
    try:
        folder = model.verify()
    except EngineUnavailable as exc:
        return Check(name, "FAIL", str(exc), LITE)
    return Check(name, "OK", f"{model.name} from {model.distribution} {model.version} at {folder}")


def _piper(settings: PiperSettings) -> Check:
    from services.tts.engines.piper import PACKAGED, PiperEngine

    if not _installed("piper"):
        return Check("model tts", "FAIL", "piper-tts missing", LITE)
    voice = settings.default_voice
    if voice in PACKAGED:
        return _packaged("model tts", PACKAGED[voice][0])
    if PiperEngine(settings).has_voice(voice):
        return Check("model tts", "OK", f"Piper voice {voice} in {settings.voices_dir}")
    fix = f"put {voice}.onnx and {voice}.onnx.json in {settings.voices_dir}, or use 'joe'"
    return Check("model tts", "FAIL", f"no Piper voice {voice!r}", fix)


def _data_node(url: str) -> str:
    """A plain URL of a data node behind `url`: the Sentinel's master, a Cluster's first
    startup node that answers, or `url` itself."""
    target = parse_url(url)
    if target.kind == "plain":
        return url
    if target.kind == "sentinel":
        sentinel = Sentinel(list(target.hosts), socket_timeout=2, password=target.password)  # type: ignore[no-untyped-call]
        host, port = sentinel.discover_master(target.service)  # type: ignore[no-untyped-call]
    else:
        host, port = next((h, p) for h, p in target.hosts if reachable(f"redis://{h}:{p}", 1.0))
    auth = f":{target.password}@" if target.password else ""
    scheme = "rediss" if target.tls else "redis"
    return f"{scheme}://{auth}{host}:{port}/{target.db}"


def check_redis(url: str) -> Check:
    """Redis answers, and is new enough for the Streams commands the bus uses (6.2)."""
    shown = redact_url(url, mark=":***")  # redis://:***@host: the password's place kept
    try:
        node = _data_node(url)
    except ValueError as exc:  # a URL the bus cannot use (parse_url says why)
        fix = "redis://, rediss://, redis+sentinel:// or redis+cluster:// (docs/redis-ha.md)"
        return Check("redis", "FAIL", f"VA_REDIS__URL {shown}: {exc}", fix)
    except (redis.RedisError, StopIteration) as exc:
        fix = "check the sentinels / cluster nodes in VA_REDIS__URL (docs/redis-ha.md)"
        reason = str(exc)[:160]
        return Check("redis", "FAIL", f"{shown}: no master or node answers ({reason})", fix)
    try:
        client = redis.Redis.from_url(node, socket_connect_timeout=2, socket_timeout=2)
    except ValueError as exc:  # redis-py's own refusal of the URL
        fix = "VA_REDIS__URL (docs/redis-ha.md)"
        return Check("redis", "FAIL", f"VA_REDIS__URL {shown}: {exc}", fix)
    try:
        version = str(client.info("server")["redis_version"])
    except redis.RedisError as exc:
        fix = "start Redis (systemctl start redis-server) or point VA_REDIS__URL at it"
        return Check("redis", "FAIL", f"{shown}: {exc}", fix)
    finally:
        client.close()
    if tuple(int(p) for p in version.split(".")[:2]) < (6, 2):
        return Check("redis", "FAIL", f"Redis {version} lacks XAUTOCLAIM", "Redis >= 6.2")
    return Check("redis", "OK", f"{shown}: Redis {version}")


def check_port(service: str, host: str, port: int) -> Check:
    """The port is free, or already serves this service's /health."""
    name = f"port {service}"
    target = reachable_host(host)
    where = host_port(target, port)
    try:
        socket.create_connection((target, port), timeout=1).close()
    except OSError:
        return Check(name, "OK", f"{where} is free")
    try:  # straight there: a proxy of the environment (HTTP_PROXY) cannot reach this host's ports
        health = httpx.get(f"http://{where}/health", timeout=2, trust_env=False).json()
    except (httpx.HTTPError, ValueError):
        health = {}
    if isinstance(health, dict) and health.get("service") == service:
        detail = f"{where} serves voice-agent {service} ({health.get('engine', '?')})"
        return Check(name, "OK", detail)
    setting = f"VA_{service.upper()}__SERVER__PORT"
    fix = f"stop what listens there (ss -ltnp 'sport = :{port}') or choose another: {setting}"
    return Check(name, "FAIL", f"{where} is taken by something else", fix)


def _self_signed(folder: Path) -> tuple[Path, Path] | None:
    openssl = shutil.which("openssl")
    if openssl is None:
        return None
    cert, key = folder / "cert.pem", folder / "key.pem"
    command = [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    command += ["-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)]
    subprocess.run(
        command,
        capture_output=True,
        check=True,
        timeout=60,
    )
    return cert, key


def _with_certificate(site: NginxSite, workdir: Path) -> tuple[NginxSite, str]:
    """The site, with a throwaway certificate if its own is missing (and a note saying so)."""
    if site.tls_cert.is_file() and site.tls_key.is_file():
        return site, ""
    made = _self_signed(workdir)
    if made is None:
        raise FileNotFoundError(f"no certificate at {site.tls_cert}, and no openssl to stand in")
    note = f"; but no certificate at {site.tls_cert} / {site.tls_key}"
    return dataclasses.replace(site, tls_cert=made[0], tls_key=made[1]), note


def check_nginx_config(site: NginxSite, conf: Path | None = None) -> Check:
    """`nginx -t` on `conf`, or on deploy/nginx/voice-agent.conf rendered for `site`."""
    if nginx_binary() is None:
        fix = "apt-get install nginx; render deploy/nginx/voice-agent.conf (docs/deployment.md)"
        return Check("nginx", "WARN", "nginx is not installed", fix)
    with tempfile.TemporaryDirectory(prefix="va-doctor-") as tmp:
        workdir = Path(tmp)
        if conf is not None:
            passed, said = check_nginx(conf, workdir)
            if passed:
                return Check("nginx", "OK", f"{conf} passes nginx -t")
            return Check("nginx", "FAIL", f"{conf} fails nginx -t: {said}", f"fix {conf}")
        try:
            site, note = _with_certificate(site, workdir)
        except FileNotFoundError as exc:
            return Check("nginx", "WARN", str(exc), "pass --tls-cert/--tls-key")
        sandboxed = site.sandboxed(workdir)
        prepare_dirs(sandboxed)
        rendered = workdir / "nginx.conf"
        rendered.write_text(render_nginx(sandboxed))
        passed, said = check_nginx(rendered, workdir)
    if not passed:
        return Check("nginx", "FAIL", f"the rendered template fails nginx -t: {said}", "fix it")
    detail = f"the rendered template passes nginx -t (gateways {', '.join(site.gateways)})"
    if note:
        return Check("nginx", "WARN", detail + note, "pass --tls-cert/--tls-key, or put them there")
    return Check("nginx", "OK", detail)
