"""The Moshi engine on a small random-weight model: batched steps, per-slot join, leave and
reset, and what a session hears does not depend on who else is in the batch."""

from __future__ import annotations

import numpy as np
import pytest

from services.duplex.engines.moshi import MoshiEngine
from tests.duplex.tiny import SLOTS, noise, step, tiny_engine

FRAMES = 10


@pytest.fixture(scope="module")
def engine() -> MoshiEngine:
    """One engine for the module: each test resets the slots it uses."""
    return tiny_engine()


def run_alone(engine: MoshiEngine, audio: np.ndarray, slot: int = 0) -> list[object]:
    """Codes of `audio` as the only session, on a fresh slot."""
    out = []
    for index, frame in enumerate(audio):
        said = step(engine, {slot: frame}, reset={slot} if index == 0 else set())
        out.append(said.slots[slot])
    return out


def test_a_session_says_the_same_whoever_joins_and_leaves(engine: MoshiEngine) -> None:
    mine, theirs, later = noise(FRAMES, 1), noise(FRAMES, 2), noise(FRAMES, 3)
    alone = run_alone(engine, mine)
    batched = []
    for index in range(FRAMES):
        frames = {0: mine[index], 1: theirs[index]}
        reset = {0, 1} if index == 0 else set()
        if 3 <= index < 8:  # a third session joins at step 3 and leaves after step 7
            frames[2] = later[index]
            reset |= {2} if index == 3 else set()
        if index in (5, 6):  # the second one sends nothing for two steps
            del frames[1]
        batched.append(step(engine, frames, reset).slots[0])
    assert [o.codes for o in batched] == [o.codes for o in alone]  # type: ignore[attr-defined]
    assert [o.text for o in batched] == [o.text for o in alone]  # type: ignore[attr-defined]
    for a, b in zip(alone, batched, strict=True):
        if a.audio is not None:  # type: ignore[attr-defined]
            np.testing.assert_allclose(b.audio, a.audio, atol=1e-5)  # type: ignore[attr-defined]


def test_a_reset_slot_starts_over_as_a_new_session(engine: MoshiEngine) -> None:
    first = run_alone(engine, noise(FRAMES, 1), slot=1)
    for frame in noise(5, 9):  # someone else uses the slot, then leaves
        step(engine, {1: frame})
    again = run_alone(engine, noise(FRAMES, 1), slot=1)
    assert [o.codes for o in again] == [o.codes for o in first]  # type: ignore[attr-defined]
    elsewhere = run_alone(engine, noise(FRAMES, 1), slot=2)
    assert [o.codes for o in elsewhere] == [o.codes for o in first]  # type: ignore[attr-defined]


def test_the_first_steps_make_no_audio_then_every_step_a_frame(engine: MoshiEngine) -> None:
    said = run_alone(engine, noise(FRAMES, 4))
    silent = [o.audio is None for o in said]  # type: ignore[attr-defined]
    # the first frame is only encoded (as moshi's server does), then the delayed codebooks
    # need one more step before the LM's output is whole
    assert silent[:2] == [True, True] and not any(silent[2:])
    assert all(o.audio.shape == (1920,) for o in said[2:])  # type: ignore[attr-defined]
    assert all(len(o.codes) == 1 + 4 for o in said[2:])  # type: ignore[attr-defined]
    assert any(o.text for o in said)  # type: ignore[attr-defined]  # a random LM rambles


def test_slots_that_do_not_step_get_nothing(engine: MoshiEngine) -> None:
    out = step(engine, {1: noise(1, 5)[0]}, reset={0, 1, 2})
    assert out.slots[0] is None and out.slots[2] is None and out.slots[1] is not None


def test_state_per_slot_is_counted_from_the_streaming_state() -> None:
    small, large = tiny_engine(), tiny_engine(random={"seed": 7, "context": 400})  # own ones
    assert 0 < small.state_bytes_per_slot() < large.state_bytes_per_slot()
    # a slot's share: the per-slot buffers and its part of a few shared ones (masks, ...)
    assert tiny_engine(slots=1).state_bytes_per_slot() == pytest.approx(
        small.state_bytes_per_slot(), rel=0.01
    )
    assert SLOTS == 3


def test_a_missing_checkpoint_names_the_pull(tmp_path: object) -> None:
    from services.common.errors import EngineUnavailable
    from services.duplex.engines.moshi import checkpoint_engine
    from tests.duplex.tiny import section

    engine = checkpoint_engine(
        section(engine="moshi", moshi={"device": "cpu", "models_dir": str(tmp_path)})
    )
    with pytest.raises(EngineUnavailable, match="voice-agent models pull moshiko-pytorch-bf16"):
        engine.load(1)
