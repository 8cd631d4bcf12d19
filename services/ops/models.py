"""`voice-agent models pull NAME [--dir DIR]` and `models list`: weights from the Hugging Face Hub
(and `smart-turn`, extracted from its pinned PyPI wheel: services/ops/wheel_models.py).

A model is pulled into `<dir>/<name>`, the folder the engines look in by default
(`VA_ASR__WHISPER__MODEL=large-v3-turbo` reads `models/faster-whisper-large-v3-turbo`,
`VA_TTS__CHATTERBOX__MODEL=chatterbox` reads `models/chatterbox`,
`VA_DUPLEX__MOSHI__MODEL=moshiko-pytorch-bf16` reads `models/moshiko-pytorch-bf16`).
Only the files the engines read are fetched. Engines never download unless told to: this command is
the one place that needs the network, and it says exactly what failed when it fails.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from services.ops import piper_voices

WHISPER_FILES: Final = (
    "config.json",
    "preprocessor_config.json",
    "model.bin",
    "tokenizer.json",
    "vocabulary.*",
)
"""What faster-whisper's own `download_model` fetches."""
CHATTERBOX_FILES: Final = (
    "ve.safetensors",
    "t3_cfg.safetensors",
    "s3gen.safetensors",
    "tokenizer.json",
    "conds.pt",
)
"""What `ChatterboxTTS.from_local` reads (`conds.pt` is the built-in voice)."""
MOSHI_FILES: Final = (
    "model.safetensors",
    "tokenizer-e351c8d8-checkpoint125.safetensors",
    "tokenizer_spm_32k_3.model",
    "config.json",
)
"""What the duplex `moshi` engine reads (`config.json`: newer repos have one; without it the
engine uses moshi's Moshi 7B configuration)."""
PERSONAPLEX_FILES: Final = (
    "model.safetensors",
    "tokenizer-e351c8d8-checkpoint125.safetensors",
    "tokenizer_spm_32k_3.model",
    "voices.tgz",
)
"""PersonaPlex's weights and its voice prompts, for NVIDIA's server (docs/duplex.md): the
duplex service's `moshi` engine refuses them (they need NVIDIA's fork of moshi)."""
OPTIONAL_FILES: Final = frozenset({"conds.pt", "config.json"})
"""Files fetched when the repo has them, not required for a complete folder."""
FASTER_WHISPER_REPOS: Final = {
    "tiny": "Systran/faster-whisper-tiny",
    "tiny.en": "Systran/faster-whisper-tiny.en",
    "base": "Systran/faster-whisper-base",
    "base.en": "Systran/faster-whisper-base.en",
    "small": "Systran/faster-whisper-small",
    "small.en": "Systran/faster-whisper-small.en",
    "medium": "Systran/faster-whisper-medium",
    "medium.en": "Systran/faster-whisper-medium.en",
    "large-v2": "Systran/faster-whisper-large-v2",
    "large-v3": "Systran/faster-whisper-large-v3",
    "large-v3-turbo": "mobiuslabsgmbh/faster-whisper-large-v3-turbo",
    "distil-large-v3": "Systran/faster-distil-whisper-large-v3",
}
"""The repos faster-whisper itself maps these names to (faster_whisper.utils._MODELS)."""
TRUE: Final = frozenset({"1", "true", "yes", "on"})


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A pullable model: its name here, its Hub repo and the files the engine reads."""

    name: str
    repo: str
    files: tuple[str, ...]
    engine: str

    def required(self) -> list[str]:
        """The files that must be present (patterns and optional files left out)."""
        return [f for f in self.files if "*" not in f and f not in OPTIONAL_FILES]


MODELS: Final = {
    **{
        f"faster-whisper-{size}": ModelSpec(f"faster-whisper-{size}", repo, WHISPER_FILES, "asr")
        for size, repo in FASTER_WHISPER_REPOS.items()
    },
    "chatterbox": ModelSpec("chatterbox", "ResembleAI/chatterbox", CHATTERBOX_FILES, "tts"),
    **{
        name: ModelSpec(name, f"kyutai/{name}", MOSHI_FILES, "duplex")
        for name in ("moshiko-pytorch-bf16", "moshika-pytorch-bf16")
    },
    "personaplex-7b-v1": ModelSpec(
        "personaplex-7b-v1", "nvidia/personaplex-7b-v1", PERSONAPLEX_FILES, "duplex"
    ),
}


class ModelError(Exception):
    """A pull that cannot succeed; the message says what failed and what to do."""


def spec(name: str) -> ModelSpec:
    """The model of that name, or ModelError listing the names."""
    try:
        return MODELS[name]
    except KeyError:
        raise ModelError(
            f"unknown model {name!r}; choose one of: {', '.join(MODELS)} (voice-agent models list)"
        ) from None


def is_complete(model: ModelSpec, folder: Path) -> bool:
    return all((folder / name).is_file() for name in model.required())


def pull(name: str, directory: Path, environ: Mapping[str, str] | None = None) -> Path:
    """Download a model into `<directory>/<name>` (a no-op when it is complete already);
    a Piper voice (`piper-<voice>`) into `<directory>/<voice>.onnx` (piper_voices.py)."""
    env = os.environ if environ is None else environ
    if piper_voices.is_piper(name):
        return _pull_voice(name, directory, env)
    model = spec(name)
    folder = directory / model.name
    if is_complete(model, folder):
        return folder
    copy_hint = (
        f"or copy a pulled {model.name} folder from another machine to {folder}"
        " (the engines never need the network)"
    )
    if env.get("HF_HUB_OFFLINE", "").strip().lower() in TRUE:
        raise ModelError(
            f"cannot download {model.name} from {model.repo}: HF_HUB_OFFLINE="
            f"{env['HF_HUB_OFFLINE']} forbids it. On a machine that can reach huggingface.co run "
            f"`HF_HUB_OFFLINE=0 voice-agent models pull {model.name} --dir {directory}`, "
            + copy_hint
        )
    _download(model, folder, copy_hint)
    missing = [f for f in model.required() if not (folder / f).is_file()]
    if missing:
        raise ModelError(f"{model.repo} gave no {', '.join(missing)}: {folder} is incomplete")
    return folder


def _pull_voice(name: str, directory: Path, env: Mapping[str, str]) -> Path:
    voice = name.removeprefix(piper_voices.PREFIX)
    try:
        piper_voices.hub_paths(voice)
    except piper_voices.VoiceNameError as exc:
        raise ModelError(str(exc)) from None
    if piper_voices.is_complete(voice, directory):
        return directory / f"{voice}.onnx"
    if env.get("HF_HUB_OFFLINE", "").strip().lower() in TRUE:
        raise ModelError(
            f"cannot download Piper voice {voice}: HF_HUB_OFFLINE={env['HF_HUB_OFFLINE']} "
            f"forbids it; copy {voice}.onnx and {voice}.onnx.json into {directory} instead"
        )
    try:
        return piper_voices.pull(name, directory)
    except ImportError as exc:
        raise ModelError(
            f"huggingface_hub is not installed ({exc}): pip install huggingface_hub"
        ) from exc
    except (OSError, ValueError) as exc:
        raise ModelError(
            f"cannot download Piper voice {voice} from {piper_voices.REPO}: "
            f"{type(exc).__name__}: {_first_line(exc)}"
        ) from exc


def _snapshot(model: ModelSpec, folder: Path) -> None:
    """`snapshot_download` of the engine's files, with the Hub's progress bars."""
    import huggingface_hub

    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        huggingface_hub.snapshot_download(
            repo_id=model.repo, local_dir=folder, allow_patterns=list(model.files)
        )
    except BaseException:
        if created and all(p.name == ".cache" for p in folder.iterdir()):
            shutil.rmtree(folder, ignore_errors=True)  # leave no empty model folder behind
        raise


def _download(model: ModelSpec, folder: Path, copy_hint: str) -> None:
    try:
        from huggingface_hub import errors
    except ImportError as exc:
        raise ModelError(
            f"huggingface_hub is not installed ({exc}): pip install huggingface_hub"
        ) from exc
    try:
        _snapshot(model, folder)
    except (errors.GatedRepoError, errors.RepositoryNotFoundError) as exc:
        raise ModelError(
            f"the Hub refused {model.repo} ({type(exc).__name__}): log in with `hf auth login` "
            "or set HF_TOKEN to a token that can read it"
        ) from exc
    except (errors.OfflineModeIsEnabled, errors.LocalEntryNotFoundError, OSError) as exc:
        raise ModelError(
            f"cannot download {model.name} from {model.repo}: the Hugging Face Hub is not "
            f"reachable ({type(exc).__name__}: {_first_line(exc)}). Check the network, "
            f"HTTPS_PROXY or HF_ENDPOINT and run the command again, {copy_hint}"
        ) from exc
    except Exception as exc:
        raise ModelError(
            f"downloading {model.name} from {model.repo} failed ({type(exc).__name__}: "
            f"{_first_line(exc)}); run the command again, {copy_hint}"
        ) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "no details"


def list_models(directory: Path) -> list[str]:
    """One line per model: name, repo, engine, and whether `<directory>/<name>` is complete."""
    lines = []
    for model in MODELS.values():
        state = "pulled" if is_complete(model, directory / model.name) else "-"
        lines.append(f"{model.name:34} {model.repo:48} {model.engine:6} {state}")
    example = f"{piper_voices.PREFIX}<lang>_<REGION>-<speaker>-<quality>"
    lines.append(f"{example:34} {piper_voices.REPO:48} {'tts':6} into voices/piper")
    return lines


def run(args: argparse.Namespace) -> None:
    """The `models` subcommand."""
    from services.ops import wheel_models

    if args.models_command == "list":
        directory = Path(args.dir or "models")
        print("\n".join(list_models(directory)))
        for name, wheel_model in wheel_models.WHEEL_MODELS.items():
            model = wheel_model().model
            state = "pulled" if model.pulled(directory).is_dir() else "-"
            origin = f"{model.distribution}=={model.version} (PyPI)"
            print(f"{name:34} {origin:48} {'gw':6} {state}")
        return
    default = piper_voices.DEFAULT_DIR if piper_voices.is_piper(args.name) else Path("models")
    directory = Path(args.dir) if args.dir else default
    try:
        _check_folder(directory)  # before any download
        if args.name in wheel_models.WHEEL_MODELS:
            folder = wheel_models.pull(args.name, directory)
        else:
            folder = pull(args.name, directory)
    except (ModelError, wheel_models.WheelPullError) as exc:
        print(f"voice-agent models pull: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from exc
    except OSError as exc:  # the folder cannot be made or written (a read-only disk, ...)
        where = exc.filename or directory
        print(
            f"voice-agent models pull: error: cannot write {where}: {exc.strerror or exc}",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(1) from None
    print(f"{args.name} is ready in {folder}")


def _check_folder(directory: Path) -> None:
    """ModelError when `directory`, or the nearest part of it that exists, is not a folder."""
    existing = next((p for p in (directory, *directory.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise ModelError(f"--dir {directory}: {existing} is a file, not a folder")


def add_models_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `models pull|list` on the CLI's subcommands."""
    models = sub.add_parser(
        "models", help="download model weights (the Hugging Face Hub, or a pinned PyPI wheel)"
    )
    actions = models.add_subparsers(dest="models_command", required=True)
    pull_cmd = actions.add_parser("pull", help="download a model into DIR/NAME")
    pull_cmd.add_argument(
        "name",
        help="a model name from `voice-agent models list`, or piper-<voice> for a Piper "
        "voice of rhasspy/piper-voices (e.g. piper-de_DE-thorsten-medium)",
    )
    pull_cmd.add_argument(
        "--dir", default=None, help="models folder (default: models; voices/piper for voices)"
    )
    list_cmd = actions.add_parser("list", help="the models that can be pulled")
    list_cmd.add_argument("--dir", default="models", help="models folder (default: models)")
    models.set_defaults(func=run)
