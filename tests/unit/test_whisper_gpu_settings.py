"""Settings → CTranslate2 arguments, GPU choice and warm-up, without a GPU.

`faster_whisper.WhisperModel` is replaced by a recorder that keeps the arguments the
engine asked for (a CUDA device, a compute type) and builds the tiny random-weight
model on the CPU instead, so the rest of `load` (warm-up included) really runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import faster_whisper
import numpy as np
import pytest

from services.asr.engines import whisper_files
from services.asr.engines.base import AsrInput
from services.asr.engines.whisper import FasterWhisperEngine
from services.asr.settings import WhisperSettings
from services.common.errors import EngineUnavailable
from services.common.platform.devices import choose_gpu, cuda_index, pin_gpu
from tests.tiny_whisper import build_tiny_whisper, offline

NOTIMESTAMPS = 50363
SOT = 50258
LANGUAGE_TOKEN = {"en": 50259, "de": 50261}

RealWhisperModel = faster_whisper.WhisperModel


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with offline():
        yield build_tiny_whisper(tmp_path_factory.mktemp("tiny-whisper"))


class Recording:
    """Wraps the CTranslate2 model: records every call and its arguments."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def recorded(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args, kwargs))
            return attr(*args, **kwargs)

        return recorded

    def named(self, name: str) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        return [(args, kwargs) for called, args, kwargs in self.calls if called == name]


class FakeWhisperModel:
    """Stands in for `faster_whisper.WhisperModel`: records, then loads on the CPU."""

    created: ClassVar[list[dict[str, Any]]] = []

    def __new__(cls, model_size_or_path: str, **kwargs: Any) -> Any:
        cls.created.append({"path": model_size_or_path, **kwargs})
        real = RealWhisperModel(model_size_or_path, device="cpu", compute_type="int8")
        real.model = Recording(real.model)
        return real


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[FakeWhisperModel]]:
    FakeWhisperModel.created = []
    monkeypatch.setattr(faster_whisper, "WhisperModel", FakeWhisperModel)
    monkeypatch.setattr(whisper_files, "cuda_device_count", lambda: 2)
    yield FakeWhisperModel


def engine_for(model_dir: Path, env: dict[str, str], **settings: Any) -> FasterWhisperEngine:
    engine = FasterWhisperEngine(WhisperSettings(model=str(model_dir), **settings), environ=env)
    engine.load()
    return engine


def recording(engine: FasterWhisperEngine) -> Recording:
    model = engine._whisper.model
    assert isinstance(model, Recording)
    return model


@pytest.mark.parametrize("compute_type", ["float16", "int8_float16", "int8"])
def test_settings_reach_ctranslate2(
    model_dir: Path, fake_gpu: type[FakeWhisperModel], compute_type: str
) -> None:
    env: dict[str, str] = {}
    engine = engine_for(model_dir, env, device="cuda", device_index=1, compute_type=compute_type)
    (created,) = fake_gpu.created
    assert created == {
        "path": str(model_dir),
        "device": "cuda",
        "device_index": 1,
        "compute_type": compute_type,
        "cpu_threads": 1,
        "local_files_only": True,
    }
    assert engine.device == "cuda:1"
    assert env == {"CT2_CUDA_ALLOCATOR": "cub_caching"}


def test_default_compute_types(model_dir: Path, fake_gpu: type[FakeWhisperModel]) -> None:
    engine_for(model_dir, {}, device="cuda")
    engine_for(model_dir, {}, device="cpu")
    assert [c["compute_type"] for c in fake_gpu.created] == ["float16", "int8"]
    assert [c["device"] for c in fake_gpu.created] == ["cuda", "cpu"]


def test_an_allocator_already_chosen_is_kept(
    model_dir: Path, fake_gpu: type[FakeWhisperModel]
) -> None:
    env = {"CT2_CUDA_ALLOCATOR": "cuda_malloc_async"}
    engine_for(model_dir, env, device="cuda")
    assert env["CT2_CUDA_ALLOCATOR"] == "cuda_malloc_async"


def test_cpu_leaves_the_environment_alone(
    model_dir: Path, fake_gpu: type[FakeWhisperModel]
) -> None:
    env: dict[str, str] = {}
    engine_for(model_dir, env, device="cpu", gpu=1)
    assert env == {}


def test_physical_gpu_pins_the_process_to_cuda_0(
    model_dir: Path, fake_gpu: type[FakeWhisperModel]
) -> None:
    env: dict[str, str] = {}
    engine = engine_for(model_dir, env, device="cuda", gpu=1)
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    assert fake_gpu.created[0]["device_index"] == 0
    assert engine.device == "cuda:0"


def test_physical_gpu_among_visible_ones(model_dir: Path, fake_gpu: type[FakeWhisperModel]) -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0,1"}
    engine = engine_for(model_dir, env, device="cuda", gpu=1)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert engine.device == "cuda:1"
    assert fake_gpu.created[0]["device_index"] == 1


def test_invisible_physical_gpu_fails_with_the_fix(
    model_dir: Path, fake_gpu: type[FakeWhisperModel]
) -> None:
    with pytest.raises(EngineUnavailable) as caught:
        FasterWhisperEngine(
            WhisperSettings(model=str(model_dir), device="cuda", gpu=1),
            environ={"CUDA_VISIBLE_DEVICES": "0"},
        )
    message = caught.value.message
    assert "VA_ASR__WHISPER__GPU=1" in message
    assert "CUDA_VISIBLE_DEVICES='0'" in message


def test_index_beyond_the_visible_gpus_is_refused(
    model_dir: Path, fake_gpu: type[FakeWhisperModel]
) -> None:
    env = {"CUDA_VISIBLE_DEVICES": "1"}
    with pytest.raises(EngineUnavailable, match="sees 2 GPU"):
        engine_for(model_dir, env, device="cuda", device_index=3)


def test_warm_up_runs_at_load(model_dir: Path, fake_gpu: type[FakeWhisperModel]) -> None:
    engine = engine_for(model_dir, {}, device="cuda")
    calls = recording(engine)
    assert len(calls.named("encode")) == 2
    assert len(calls.named("generate")) == 2
    assert len(calls.named("detect_language")) == 1  # both decoding paths are warm
    cold = engine_for(model_dir, {}, device="cuda", warmup=False)
    assert recording(cold).calls == []


def test_low_latency_decoding(model_dir: Path, fake_gpu: type[FakeWhisperModel]) -> None:
    engine = engine_for(model_dir, {}, device="cuda", warmup=False)
    calls = recording(engine)
    audio = np.zeros(16000, dtype=np.float32)
    engine.transcribe_batch([AsrInput(audio, "de"), AsrInput(audio, "en")])
    ((args, kwargs),) = calls.named("generate")
    prompts = args[1]
    assert prompts == [
        [SOT, LANGUAGE_TOKEN["de"], 50359, NOTIMESTAMPS],
        [SOT, LANGUAGE_TOKEN["en"], 50359, NOTIMESTAMPS],
    ]
    assert kwargs["beam_size"] == 1
    assert kwargs["sampling_topk"] == 1  # greedy: temperature 0, no sampling, no fallback
    assert calls.named("detect_language") == []  # the session's language is used as is


def test_default_language_skips_detection(
    model_dir: Path, fake_gpu: type[FakeWhisperModel]
) -> None:
    engine = engine_for(model_dir, {}, device="cuda", warmup=False, language="de")
    calls = recording(engine)
    (result,) = engine.transcribe_batch([AsrInput(np.zeros(8000, dtype=np.float32))])
    assert result.language == "de"
    assert calls.named("detect_language") == []
    ((args, _),) = calls.named("generate")
    assert args[1] == [[SOT, LANGUAGE_TOKEN["de"], 50359, NOTIMESTAMPS]]


@pytest.mark.parametrize(
    ("physical", "index", "visible", "expected"),
    [
        (None, 0, None, (0, None)),
        (None, 1, "2,3", (1, None)),
        (1, 0, None, (0, "1")),
        (1, 0, "0,1", (1, None)),
        (1, 0, " 1 ", (0, None)),
    ],
)
def test_gpu_choice(
    physical: int | None, index: int, visible: str | None, expected: tuple[int, str | None]
) -> None:
    choice = choose_gpu(physical, index, visible, "VA_X__GPU")
    assert (choice.index, choice.pin) == expected


def test_a_gpu_after_an_invalid_entry_is_not_visible() -> None:
    with pytest.raises(EngineUnavailable):  # CUDA stops reading the list at "-1"
        choose_gpu(1, 0, "0,-1,1", "VA_X__GPU")


def test_pin_gpu_writes_the_environment() -> None:
    env: dict[str, str] = {}
    assert pin_gpu(1, 0, env, "VA_X__GPU") == 0
    assert env == {"CUDA_VISIBLE_DEVICES": "1"}
    with pytest.raises(EngineUnavailable):
        pin_gpu(1, 0, {"CUDA_VISIBLE_DEVICES": ""}, "VA_X__GPU")


def test_cuda_index() -> None:
    assert [cuda_index(d) for d in ("cpu", "cuda", "cuda:0", "cuda:3")] == [None, 0, 0, 3]
