"""The duplex stepper with the fake engine: slots, admission, batching, join and leave."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from services.common.errors import CapacityError
from services.duplex.engines.base import SlotOutput, StepInput, StepOutput
from services.duplex.engines.fake import FakeDuplexEngine
from services.duplex.framing import FrameAssembler
from services.duplex.settings import DuplexSettings, FakeDuplexSettings
from services.duplex.stepper import Stepper

FRAME = 1920


class RecordingEngine(FakeDuplexEngine):
    """The fake engine, keeping every step's active and reset masks."""

    def __init__(self) -> None:
        super().__init__(FakeDuplexSettings(gain=1.0, text_every=1000))
        self.batches: list[tuple[list[int], list[int]]] = []

    def step(self, batch: StepInput) -> StepOutput:
        self.batches.append(
            (np.flatnonzero(batch.active).tolist(), np.flatnonzero(batch.reset).tolist())
        )
        return super().step(batch)


def frame(value: float) -> np.ndarray:
    return np.full(FRAME, value, np.float32)


async def take(output: asyncio.Queue[SlotOutput | None]) -> SlotOutput:
    async with asyncio.timeout(10):
        item = await output.get()
    assert item is not None
    return item


def stepper(engine: FakeDuplexEngine, slots: int = 2, gather_ms: float = 0.0) -> Stepper:
    engine.load(slots)
    return Stepper(engine, slots, gather_ms, 25, 25, retry_after_s=3.0)


async def test_a_session_beyond_the_slots_is_refused_with_a_retry_hint() -> None:
    steps = stepper(FakeDuplexEngine(FakeDuplexSettings()), slots=2)
    first, _ = steps.join("a"), steps.join("b")
    with pytest.raises(CapacityError) as refused:
        steps.join("c")
    assert refused.value.close_code == 1013
    assert refused.value.retry_after_s == 3.0
    assert "retry after 3 s" in refused.value.message
    steps.leave(first)
    assert steps.join("c").index == first.index  # the freed slot is taken again


async def test_draining_refuses_new_sessions() -> None:
    steps = stepper(FakeDuplexEngine(FakeDuplexSettings()))
    steps.draining = True
    with pytest.raises(CapacityError, match="draining"):
        steps.join("a")


async def test_sessions_with_frames_waiting_share_one_step() -> None:
    engine = RecordingEngine()
    steps = stepper(engine)
    a, b = steps.join("a"), steps.join("b")
    await steps.push(a, frame(0.1))
    await steps.push(b, frame(0.2))
    runner = asyncio.create_task(steps.run())
    try:
        await take(a.output)
        await take(b.output)
    finally:
        runner.cancel()
    assert engine.batches[0] == ([0, 1], [0, 1])  # one step, both slots, both reset first


async def test_a_step_waits_for_a_late_frame_of_the_last_batch() -> None:
    engine = RecordingEngine()
    steps = stepper(engine, gather_ms=5_000)
    a, b = steps.join("a"), steps.join("b")
    await steps.push(a, frame(0.1))
    await steps.push(b, frame(0.1))
    runner = asyncio.create_task(steps.run())
    try:
        await take(a.output)
        await take(b.output)
        await steps.push(a, frame(0.2))  # b's next frame comes later: the step waits for it
        await asyncio.sleep(0)
        await steps.push(b, frame(0.2))
        await take(a.output)
        await take(b.output)
    finally:
        runner.cancel()
    assert [active for active, _ in engine.batches] == [[0, 1], [0, 1]]


async def test_a_new_session_gets_a_reset_slot_and_the_other_goes_on() -> None:
    engine = RecordingEngine()
    steps = stepper(engine)
    runner = asyncio.create_task(steps.run())
    try:
        a = steps.join("a")
        await steps.push(a, frame(0.1))
        await take(a.output)
        b = steps.join("b")
        await steps.push(b, frame(0.3))
        first_b = await take(b.output)
        steps.leave(b)
        c = steps.join("c")  # takes b's slot again
        await steps.push(a, frame(0.2))
        await steps.push(c, frame(0.4))
        echo_a, first_c = await take(a.output), await take(c.output)
    finally:
        runner.cancel()
    assert c.index == b.index
    assert first_b.audio is not None and first_c.audio is not None
    assert np.allclose(first_c.audio, 0.0)  # c hears nothing of b: its slot was reset
    assert np.allclose(first_b.audio, 0.0)
    assert echo_a.audio is not None and np.allclose(echo_a.audio, 0.1)  # a went on as before
    resets = [reset for _, reset in engine.batches]
    assert resets.count([c.index]) == 2  # b's first step, then c's


async def test_a_session_that_left_mid_step_gets_nothing() -> None:
    engine = FakeDuplexEngine(FakeDuplexSettings(step_ms=50))
    steps = stepper(engine)
    a = steps.join("a")
    await steps.push(a, frame(0.1))
    runner = asyncio.create_task(steps.run())
    try:
        async with asyncio.timeout(10):
            while a.frames:  # taken: the 50 ms step is running
                await asyncio.sleep(0.001)
            steps.leave(a)
            while steps.steps == 0:  # the step ended, and handed out what it made
                await asyncio.sleep(0.001)
    finally:
        runner.cancel()
    assert a.output.empty()
    assert steps.live == 0


async def test_a_full_input_makes_the_client_wait() -> None:
    engine = FakeDuplexEngine(FakeDuplexSettings())
    engine.load(1)
    steps = Stepper(engine, 1, 0.0, max_input_frames=2, max_output_frames=2, retry_after_s=1)
    a = steps.join("a")
    await steps.push(a, frame(0.1))
    await steps.push(a, frame(0.1))
    blocked = asyncio.create_task(steps.push(a, frame(0.1)))
    await asyncio.sleep(0.05)
    assert not blocked.done()
    runner = asyncio.create_task(steps.run())
    try:
        async with asyncio.timeout(10):
            await blocked
    finally:
        runner.cancel()


async def test_leaving_releases_a_client_waiting_for_room() -> None:
    """The model is behind and the session's input full: its client left. Its frame waiting
    for room is dropped at once, not when the model next takes a frame (it waited then)."""
    engine = FakeDuplexEngine(FakeDuplexSettings())
    engine.load(1)
    steps = Stepper(engine, 1, 0.0, max_input_frames=1, max_output_frames=2, retry_after_s=1)
    a = steps.join("a")
    await steps.push(a, frame(0.1))
    blocked = asyncio.create_task(steps.push(a, frame(0.2)))
    async with asyncio.timeout(10):
        while a.space.is_set():  # it waits for room now
            await asyncio.sleep(0)
    steps.leave(a)  # no step runs: only leaving can release it
    async with asyncio.timeout(10):
        await blocked
    assert len(a.frames) == 1 and steps.live == 0


def test_frames_are_cut_whatever_the_client_sends() -> None:
    frames = FrameAssembler(FRAME)
    audio = np.arange(3 * FRAME + 7, dtype=np.float32)
    out = []
    for size in (5, 1000, 3000, 1, 1757 + 7):
        out += frames.push(audio[:size])
        audio = audio[size:]
    assert len(out) == 3 and frames.pending == 7
    assert np.array_equal(np.concatenate(out), np.arange(3 * FRAME, dtype=np.float32))


def test_profiles_choose_the_engine_and_the_gpu() -> None:
    duplex = DuplexSettings(profile="duplex").duplex
    assert (duplex.engine, duplex.moshi.device, duplex.moshi.gpu) == ("moshi", "cuda", 0)
    assert DuplexSettings(profile="fake").duplex.engine == "fake"
    lite = DuplexSettings().duplex
    assert (lite.engine, lite.moshi.device, lite.moshi.gpu) == ("moshi", "auto", None)


def test_an_unknown_engine_names_the_choices() -> None:
    from services.duplex.engines import create_engine
    from services.duplex.settings import DuplexSection

    with pytest.raises(ValueError, match="fake, moshi, moshi-random"):
        create_engine(DuplexSection(engine="nope"))


def test_personaplex_is_refused_with_the_reason() -> None:
    from services.common.errors import EngineUnavailable
    from services.duplex.engines.moshi import model_folder
    from services.duplex.settings import MoshiSettings

    with pytest.raises(EngineUnavailable, match="NVIDIA's fork of moshi"):
        model_folder(MoshiSettings(model="personaplex-7b-v1"))
