"""Where a faster-whisper model lives and what it runs on: the model folder (a packaged
wheel's, a pulled one, or a download when allowed), the compute type and the CUDA checks.
Every failure is an EngineUnavailable that names the command that fixes it."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from services.asr.engines.catalog import PACKAGED
from services.asr.settings import WhisperSettings
from services.common.errors import EngineUnavailable
from services.common.platform.devices import VISIBLE

log = logging.getLogger(__name__)


def resolve_model_dir(settings: WhisperSettings) -> Path:
    """`settings.model` when it is a folder, else `<models_dir>/faster-whisper-<model>`.

    A packaged model (`tiny.en`) is found by `model_folder` before this is asked."""
    given = Path(settings.model).expanduser()
    if given.is_dir() or given.is_absolute() or settings.model.startswith((".", "~")):
        return given
    return settings.models_dir / f"faster-whisper-{settings.model}"


def cuda_device_count() -> int:
    try:
        import ctranslate2
    except ImportError:
        return 0
    return int(ctranslate2.get_cuda_device_count())


def model_folder(settings: WhisperSettings) -> Path:
    """The folder the model loads from, checked to hold CTranslate2's files."""
    packaged = PACKAGED.get(settings.model)
    if packaged is not None and not resolve_model_dir(settings).is_dir():
        return packaged.materialize(settings.models_dir / "packaged")
    folder = resolve_model_dir(settings)
    if not folder.is_dir():
        if folder == Path(settings.model).expanduser():
            raise EngineUnavailable(
                f"no faster-whisper model folder at {folder}: set VA_ASR__WHISPER__MODEL "
                "to a model folder, or to a model name and run: voice-agent models pull "
                f"faster-whisper-<name> --dir {settings.models_dir}"
            )
        if not settings.allow_download:
            raise EngineUnavailable(
                f"faster-whisper model not found at {folder}: run: voice-agent models pull "
                f"faster-whisper-{settings.model} --dir {settings.models_dir} "
                "(or set VA_ASR__WHISPER__MODEL to a model folder)"
            )
        _download(settings.model, folder)
    if not (folder / "model.bin").is_file():
        raise EngineUnavailable(
            f"{folder} holds no CTranslate2 model.bin: pull the model again with "
            f"voice-agent models pull faster-whisper-{settings.model}"
        )
    if not (folder / "tokenizer.json").is_file():
        raise EngineUnavailable(
            f"no tokenizer.json in {folder} (faster-whisper would fetch one from the Hub): "
            f"pull the model again with voice-agent models pull "
            f"faster-whisper-{settings.model}, or copy in the tokenizer.json "
            "of the matching openai/whisper model"
        )
    return folder


def _download(model: str, folder: Path) -> None:
    from faster_whisper.utils import download_model

    log.warning("downloading faster-whisper %s into %s", model, folder)
    try:
        download_model(model, output_dir=str(folder))
    except Exception as exc:
        raise EngineUnavailable(
            f"cannot download faster-whisper {model} into {folder}: {exc}"
        ) from exc


def compute_type(settings: WhisperSettings, kind: str) -> str:
    """The setting, else float16 on a GPU and int8 on a CPU."""
    if settings.compute_type != "default":
        return settings.compute_type
    return "float16" if kind == "cuda" else "int8"


def check_cuda(index: int, environ: Mapping[str, str]) -> None:
    """Refuse a CUDA load that cannot work, saying why (no GPU seen, index out of range)."""
    count = cuda_device_count()
    visible = environ.get(VISIBLE, "<unset>")
    if count == 0:
        raise EngineUnavailable(
            "faster-whisper is set to CUDA but CTranslate2 sees no GPU "
            f"(CUDA_VISIBLE_DEVICES={visible}): fix the driver, "
            "or set VA_ASR__WHISPER__DEVICE=cpu"
        )
    if index >= count:
        raise EngineUnavailable(
            f"device_index {index} but this process sees {count} GPU(s) "
            f"(CUDA_VISIBLE_DEVICES={visible}); indices count from 0 among the visible "
            "GPUs: set VA_ASR__WHISPER__DEVICE_INDEX accordingly"
        )
