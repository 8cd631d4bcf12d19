"""`voice-agent models pull piper-<voice>`: a Piper voice from the Hub into the voices folder.

Piper voices for other languages (`de_DE-thorsten-medium`, `fr_FR-siwis-medium`, ...)
live in the Hub repo rhasspy/piper-voices as `<lang>/<lang>_<REGION>/<speaker>/<quality>/
<voice>.onnx` with its `.onnx.json`. Pulling one puts both files flat into the TTS
service's voices folder (`VA_TTS__PIPER__VOICES_DIR`, `voices/piper` by default), where
the Piper engine speaks it as `<voice>` with no restart: `voice=de_DE-thorsten-medium`.
Each voice's licence is in its model card on the Hub (most are CC-BY or CC0; check the
one you deploy). Tests never download: they fake the Hub call.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path
from typing import Final

REPO: Final = "rhasspy/piper-voices"
PREFIX: Final = "piper-"
DEFAULT_DIR: Final = Path("voices/piper")
"""The Piper engine's `voices_dir` default."""
VOICE: Final = re.compile(
    r"^(?P<lang>[a-z]{2,3})_(?P<region>[A-Z]{2})-(?P<speaker>[A-Za-z0-9_]+)"
    r"-(?P<quality>x_low|low|medium|high)$"
)


class VoiceNameError(ValueError):
    """Not a Piper voice name (`<lang>_<REGION>-<speaker>-<quality>`)."""


def is_piper(name: str) -> bool:
    return name.startswith(PREFIX)


def hub_paths(voice: str) -> tuple[str, str]:
    """The voice's `.onnx` and `.onnx.json` paths in the Hub repo."""
    found = VOICE.match(voice)
    if found is None:
        raise VoiceNameError(
            f"{voice!r} is not a Piper voice name: <lang>_<REGION>-<speaker>-<quality>, "
            "e.g. de_DE-thorsten-medium (the list: huggingface.co/rhasspy/piper-voices)"
        )
    lang, region, speaker, quality = found.group("lang", "region", "speaker", "quality")
    folder = f"{lang}/{lang}_{region}/{speaker}/{quality}"
    return f"{folder}/{voice}.onnx", f"{folder}/{voice}.onnx.json"


def is_complete(voice: str, directory: Path) -> bool:
    return all((directory / name).is_file() for name in (f"{voice}.onnx", f"{voice}.onnx.json"))


def pull(name: str, directory: Path) -> Path:
    """Download voice `piper-<voice>` into `<directory>/<voice>.onnx` (+ `.onnx.json`);
    a no-op when both are there. Returns the `.onnx` path."""
    import huggingface_hub

    voice = name.removeprefix(PREFIX)
    onnx, config = hub_paths(voice)
    if is_complete(voice, directory):
        return directory / f"{voice}.onnx"
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory, prefix=".pull-") as staging:
        huggingface_hub.snapshot_download(
            repo_id=REPO, local_dir=staging, allow_patterns=[onnx, config]
        )
        for path in (config, onnx):  # the model last: a voice is whole once its .onnx is there
            source = Path(staging) / path
            if not source.is_file():
                raise FileNotFoundError(f"{REPO} has no {path}: is {voice!r} a published voice?")
            shutil.move(source, directory / Path(path).name)
    return directory / f"{voice}.onnx"
