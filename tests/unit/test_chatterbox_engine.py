"""The chatterbox adapter, driven by a fake model (no torch, no chatterbox-tts)."""

from __future__ import annotations

import sys
import threading
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest

from services.common.errors import EngineUnavailable, UnknownVoice
from services.tts.engines.base import SpeechRequest, TtsEngine
from services.tts.engines.chatterbox import REQUIRED_FILES, ChatterboxEngine
from services.tts.settings import ChatterboxSettings


@dataclass
class FakeConds:
    voice: str
    t3: str = "t3"


@dataclass
class Call:
    text: str
    voice: str
    voice_after: str
    t3: str
    options: dict[str, float]


class FakeTensor:
    """Just the torch.Tensor surface the adapter uses."""

    def __init__(self, data: np.ndarray) -> None:
        self._data = data

    def detach(self) -> FakeTensor:
        return self

    def cpu(self) -> FakeTensor:
        return self

    def float(self) -> FakeTensor:
        return FakeTensor(self._data.astype(np.float32))

    def numpy(self) -> np.ndarray:
        return self._data


@dataclass
class FakeModel:
    """ChatterboxTTS in miniature: shared `conds`, mutated as the real one mutates it."""

    folder: Path | None
    device: str
    builtin: bool = True
    sr: int = 24000
    samples_per_char: int = 1000
    as_tensor: bool = False
    conds: FakeConds | None = None
    prepared: list[str] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.conds = FakeConds("default") if self.builtin else None

    def prepare_conditionals(self, wav_fpath: str, exaggeration: float = 0.5) -> None:
        time.sleep(0.01)
        self.prepared.append(Path(wav_fpath).stem)
        self.conds = FakeConds(Path(wav_fpath).stem)

    def generate(self, text: str, **options: float) -> Any:
        assert self.conds is not None
        voice, t3 = self.conds.voice, self.conds.t3
        time.sleep(0.005)  # a window for another request to swap conds
        self.conds.t3 = f"exaggeration={options['exaggeration']}"  # as upstream does
        self.calls.append(Call(text, voice, self.conds.voice, t3, options))
        wav = np.full((1, len(text) * self.samples_per_char), 0.25, dtype=np.float64)
        return FakeTensor(wav) if self.as_tensor else wav


class Factory:
    def __init__(self, **model_options: Any) -> None:
        self.options = model_options
        self.model: FakeModel | None = None

    def __call__(self, folder: Path | None, device: str) -> FakeModel:
        self.model = FakeModel(folder, device, **self.options)
        return self.model


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "models" / "chatterbox"
    folder.mkdir(parents=True)
    for name in REQUIRED_FILES:
        (folder / name).write_bytes(b"x")
    return tmp_path / "models"


@pytest.fixture
def voices_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "voices"
    folder.mkdir()
    for name in ("alice", "bob", "bad name"):
        (folder / f"{name}.wav").write_bytes(b"RIFF")
    return folder


def make(
    models_dir: Path, voices_dir: Path | None = None, chunk_ms: int = 400, **model_options: Any
) -> tuple[ChatterboxEngine, Factory]:
    factory = Factory(**model_options)
    settings = ChatterboxSettings(models_dir=models_dir, device="cpu", chunk_ms=chunk_ms)
    engine = ChatterboxEngine(settings, voices_dir=voices_dir, model_factory=factory)
    engine.load()
    return engine, factory


def audio(engine: ChatterboxEngine, text: str, voice: str = "default", **kw: Any) -> np.ndarray:
    chunks = list(engine.synthesize(SpeechRequest(text=text, voice=voice, **kw)))
    return np.concatenate(chunks) if chunks else np.zeros(0, np.float32)


def test_missing_folder_names_the_pull_command(tmp_path: Path) -> None:
    settings = ChatterboxSettings(models_dir=tmp_path / "nowhere", device="cpu")
    engine = ChatterboxEngine(settings, model_factory=Factory())
    with pytest.raises(EngineUnavailable) as caught:
        engine.load()
    message = caught.value.message
    assert str(tmp_path / "nowhere" / "chatterbox") in message
    assert f"voice-agent models pull chatterbox --dir {tmp_path / 'nowhere'}" in message


@pytest.mark.parametrize("missing", REQUIRED_FILES)
def test_missing_file_is_named(models_dir: Path, missing: str) -> None:
    (models_dir / "chatterbox" / missing).unlink()
    with pytest.raises(EngineUnavailable, match=f"{missing}.*voice-agent models pull"):
        make(models_dir)


def test_model_may_be_a_folder_path(models_dir: Path, tmp_path: Path) -> None:
    factory = Factory()
    settings = ChatterboxSettings(model=str(models_dir / "chatterbox"), device="cpu")
    ChatterboxEngine(settings, model_factory=factory).load()
    assert factory.model is not None
    assert factory.model.folder == models_dir / "chatterbox"


def test_allow_download_asks_the_hub(tmp_path: Path) -> None:
    factory = Factory()
    settings = ChatterboxSettings(models_dir=tmp_path, device="cpu", allow_download=True)
    ChatterboxEngine(settings, model_factory=factory).load()
    assert factory.model is not None
    assert factory.model.folder is None


@pytest.mark.parametrize(
    ("device", "cuda", "expected"),
    [
        ("auto", True, "cuda:1"),
        ("auto", False, "cpu"),
        ("cuda", True, "cuda:1"),
        ("cpu", True, "cpu"),
    ],
)
def test_device_resolution(
    models_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    device: Literal["auto", "cpu", "cuda"],
    cuda: bool,
    expected: str,
) -> None:
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: cuda))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    factory = Factory()
    settings = ChatterboxSettings(models_dir=models_dir, device=device, device_index=1)
    engine = ChatterboxEngine(settings, model_factory=factory)
    engine.load()
    assert factory.model is not None
    assert (factory.model.device, engine.device) == (expected, expected)


def test_describes_itself(models_dir: Path) -> None:
    engine, _ = make(models_dir, sr=22050)
    typed: TtsEngine = engine
    assert (typed.name, typed.sample_rate, typed.default_voice) == ("chatterbox", 22050, "default")


def test_synthesize_before_load_is_unavailable(models_dir: Path) -> None:
    engine = ChatterboxEngine(ChatterboxSettings(models_dir=models_dir), model_factory=Factory())
    with pytest.raises(EngineUnavailable):
        engine.synthesize(SpeechRequest(text="hi", voice="default"))


def test_voices_are_builtin_plus_clips(models_dir: Path, voices_dir: Path) -> None:
    engine, _ = make(models_dir, voices_dir)
    assert engine.voices() == ["alice", "bob", "default"]
    bare, _ = make(models_dir, voices_dir, builtin=False)
    assert bare.voices() == ["alice", "bob"]
    with pytest.raises(UnknownVoice):
        bare.synthesize(SpeechRequest(text="hi", voice="default"))


@pytest.mark.parametrize("voice", ["carol", "bad name", "../voices/alice", ""])
def test_unknown_voice_is_refused_before_streaming(
    models_dir: Path, voices_dir: Path, voice: str
) -> None:
    engine, factory = make(models_dir, voices_dir, builtin=False)
    with pytest.raises(UnknownVoice):
        engine.synthesize(SpeechRequest(text="hi", voice=voice))
    assert factory.model is not None
    assert factory.model.prepared == []


def test_each_voice_is_conditioned_once(models_dir: Path, voices_dir: Path) -> None:
    engine, factory = make(models_dir, voices_dir)
    engine.prepare_voice("bob")
    start = threading.Barrier(4)

    def run() -> None:
        start.wait()
        for voice in ("alice", "bob", "alice", "default"):
            audio(engine, "hello", voice)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert factory.model is not None
    assert sorted(factory.model.prepared) == ["alice", "bob"]
    assert len(factory.model.calls) == 16
    engine.forget_voice("alice")
    audio(engine, "hello", "alice")
    assert sorted(factory.model.prepared) == ["alice", "alice", "bob"]


def test_concurrent_requests_see_their_own_voice(models_dir: Path, voices_dir: Path) -> None:
    engine, factory = make(models_dir, voices_dir)
    voices = ["alice", "bob", "default"] * 2
    start = threading.Barrier(len(voices))

    def run(voice: str) -> None:
        start.wait()
        for _ in range(4):
            audio(engine, f"spoken by {voice}", voice, exaggeration=0.9)

    threads = [threading.Thread(target=run, args=(voice,)) for voice in voices]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert factory.model is not None
    calls = factory.model.calls
    assert len(calls) == 4 * len(voices)
    for call in calls:
        assert call.text == f"spoken by {call.voice}"
        assert call.voice_after == call.voice
        assert call.t3 == "t3"  # generate's change to conds never reaches the cache


def test_request_overrides_reach_generate(models_dir: Path) -> None:
    engine, factory = make(models_dir)
    audio(engine, "defaults")
    audio(engine, "custom", exaggeration=1.2, cfg_weight=0.0, temperature=0.3)
    assert factory.model is not None
    defaults, custom = (call.options for call in factory.model.calls)
    assert defaults == {"exaggeration": 0.5, "cfg_weight": 0.5, "temperature": 0.8}
    assert custom == {"exaggeration": 1.2, "cfg_weight": 0.0, "temperature": 0.3}


@pytest.mark.parametrize("as_tensor", [False, True])
def test_audio_comes_in_chunk_ms_pieces(models_dir: Path, as_tensor: bool) -> None:
    engine, _ = make(models_dir, chunk_ms=100, as_tensor=as_tensor)
    chunks = list(engine.synthesize(SpeechRequest(text="a" * 25, voice="default")))
    assert [c.size for c in chunks] == [2400] * 10 + [1000]
    assert all(c.dtype == np.float32 and c.ndim == 1 for c in chunks)
    assert np.allclose(np.concatenate(chunks), 0.25)


def test_empty_text_yields_nothing(models_dir: Path) -> None:
    engine, factory = make(models_dir)
    assert audio(engine, "  \n").size == 0
    assert factory.model is not None
    assert factory.model.calls == []
