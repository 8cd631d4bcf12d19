"""The streaming chatterbox engine, driven by a fake backend (no torch, no chatterbox-tts).

The fake's token generator yields each token's own index and counts the steps; its
"vocoder" renders a sine wave the way S3Gen renders speech: silent then fading in
over the first 40 ms, the last 3 tokens left out unless the rendering is final, and
a sagging end where a non-final rendering lacks what comes next. Joined, the stream
must be that sine without a click.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import pytest
from pydantic import ValidationError

from services.common.errors import EngineUnavailable, UnknownVoice
from services.tts.engines.base import LibraryVoice, SpeechRequest, TtsEngine
from services.tts.engines.chatterbox import REQUIRED_FILES, ChatterboxEngine
from services.tts.engines.chatterbox_backend import Sampling
from services.tts.settings import ChatterboxSettings
from tests.turns import TakingTurns

RATE = 24000
PER_TOKEN = 960
FREQ = 220.0


@dataclass
class FakeConds:
    voice: str


@dataclass
class TokenCall:
    voice: str
    text: str
    sampling: Sampling


def sine(start: int, end: int) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * FREQ * np.arange(start, end) / RATE)).astype(np.float32)


@dataclass
class FakeBackend:
    """chatterbox in miniature: a token generator and a vocoder of a sine wave."""

    folder: Path | None
    device: str
    settings: ChatterboxSettings
    builtin: bool = True
    tokens_per_char: int = 2
    step_s: float = 0.0
    sample_rate: int = RATE
    builtin_conds: FakeConds | None = None
    prepared: list[str] = field(default_factory=list)
    token_calls: list[TokenCall] = field(default_factory=list)
    renders: list[tuple[int, int, bool]] = field(default_factory=list)
    produced: int = 0
    closed: int = 0
    steps: list[str] = field(default_factory=list)
    hold: Callable[[], None] = lambda: None
    """Called inside each model step (in the engine's turn): a test can keep the turn
    until the other stream has asked for the next one."""

    def __post_init__(self) -> None:
        self.builtin_conds = FakeConds("default") if self.builtin else None

    def prepare(self, clip: Path, exaggeration: float) -> FakeConds:
        time.sleep(0.01)  # a window for a racing thread
        self.prepared.append(clip.stem)
        return FakeConds(clip.stem)

    def tokens(self, conds: FakeConds, text: str, sampling: Sampling) -> Iterator[int]:
        self.token_calls.append(TokenCall(conds.voice, text, sampling))
        try:
            for index in range(len(text) * self.tokens_per_char):
                if self.step_s:
                    time.sleep(self.step_s)
                self.hold()
                self.produced += 1
                self.steps.append(text)
                yield index
        finally:
            self.closed += 1

    def render(self, conds: FakeConds, tokens: Sequence[int], final: bool) -> np.ndarray:
        self.hold()
        self.renders.append((tokens[0], len(tokens), final))
        count = len(tokens) if final else max(0, len(tokens) - 3)
        audio = sine(tokens[0] * PER_TOKEN, (tokens[0] + count) * PER_TOKEN)
        ramp = np.zeros(PER_TOKEN, np.float32)
        ramp[PER_TOKEN // 2 :] = (np.cos(np.linspace(np.pi, 0, PER_TOKEN // 2)) + 1) / 2
        audio[:PER_TOKEN] *= ramp[: audio[:PER_TOKEN].size]
        if not final and audio.size:
            audio[-480:] *= np.linspace(1.0, 0.3, audio[-480:].size, dtype=np.float32)
        return audio


class Factory:
    def __init__(self, **options: Any) -> None:
        self.options = options
        self.backend: FakeBackend | None = None

    def __call__(self, folder: Path | None, device: str, settings: ChatterboxSettings) -> Any:
        self.backend = FakeBackend(folder, device, settings, **self.options)
        return self.backend


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
    models_dir: Path,
    voices_dir: Path | None = None,
    settings: dict[str, Any] | None = None,
    **options: Any,
) -> tuple[ChatterboxEngine, FakeBackend]:
    factory = Factory(**options)
    chosen = ChatterboxSettings(models_dir=models_dir, device="cpu", **(settings or {}))
    engine = ChatterboxEngine(chosen, voices_dir=voices_dir, backend_factory=factory)
    engine.load()
    assert factory.backend is not None
    return engine, factory.backend


def request(text: str, voice: str = "default", **kw: Any) -> SpeechRequest:
    return SpeechRequest(text=text, voice=voice, **kw)


def audio(engine: ChatterboxEngine, text: str, voice: str = "default", **kw: Any) -> np.ndarray:
    chunks = list(engine.synthesize(request(text, voice, **kw)))
    return np.concatenate(chunks) if chunks else np.zeros(0, np.float32)


# --- loading ------------------------------------------------------------------------


def test_missing_folder_names_the_pull_command(tmp_path: Path) -> None:
    settings = ChatterboxSettings(models_dir=tmp_path / "nowhere", device="cpu")
    engine = ChatterboxEngine(settings, backend_factory=Factory())
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


def test_model_may_be_a_folder_path(models_dir: Path) -> None:
    factory = Factory()
    settings = ChatterboxSettings(model=str(models_dir / "chatterbox"), device="cpu")
    ChatterboxEngine(settings, backend_factory=factory).load()
    assert factory.backend is not None
    assert factory.backend.folder == models_dir / "chatterbox"


def test_allow_download_asks_the_hub(tmp_path: Path) -> None:
    factory = Factory()
    settings = ChatterboxSettings(models_dir=tmp_path, device="cpu", allow_download=True)
    ChatterboxEngine(settings, backend_factory=factory).load()
    assert factory.backend is not None
    assert factory.backend.folder is None


@pytest.mark.parametrize(
    ("device", "cuda", "gpu", "env", "expected", "pinned"),
    [
        ("auto", True, None, {}, "cuda:1", None),
        ("auto", False, None, {}, "cpu", None),
        ("cuda", True, None, {}, "cuda:1", None),
        ("cpu", True, 1, {}, "cpu", None),
        ("cuda", True, 1, {}, "cuda:0", "1"),
        ("cuda", True, 1, {"CUDA_VISIBLE_DEVICES": "0,1"}, "cuda:1", "0,1"),
    ],
)
def test_device_resolution(
    models_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    device: Literal["auto", "cpu", "cuda"],
    cuda: bool,
    gpu: int | None,
    env: dict[str, str],
    expected: str,
    pinned: str | None,
) -> None:
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: cuda))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    factory = Factory()
    settings = ChatterboxSettings(models_dir=models_dir, device=device, device_index=1, gpu=gpu)
    engine = ChatterboxEngine(settings, backend_factory=factory, environ=env)
    engine.load()
    assert factory.backend is not None
    assert (factory.backend.device, engine.device) == (expected, expected)
    assert env.get("CUDA_VISIBLE_DEVICES") == pinned


def test_invisible_gpu_fails_with_the_fix(models_dir: Path) -> None:
    settings = ChatterboxSettings(models_dir=models_dir, device="cuda", gpu=1)
    engine = ChatterboxEngine(
        settings, backend_factory=Factory(), environ={"CUDA_VISIBLE_DEVICES": "0"}
    )
    with pytest.raises(EngineUnavailable, match="VA_TTS__CHATTERBOX__GPU=1"):
        engine.load()


def test_describes_itself(models_dir: Path) -> None:
    engine, _ = make(models_dir, sample_rate=22050)
    typed: TtsEngine = engine
    assert (typed.name, typed.sample_rate, typed.default_voice) == ("chatterbox", 22050, "default")


def test_synthesize_before_load_is_unavailable(models_dir: Path) -> None:
    engine = ChatterboxEngine(ChatterboxSettings(models_dir=models_dir), backend_factory=Factory())
    with pytest.raises(EngineUnavailable):
        engine.synthesize(request("hi"))


def test_context_must_cover_the_join() -> None:
    with pytest.raises(ValidationError, match="context_tokens"):
        ChatterboxSettings(context_tokens=4, overlap_ms=40)
    ChatterboxSettings(context_tokens=5, overlap_ms=40)


# --- streaming ----------------------------------------------------------------------


def test_chunk_boundaries(models_dir: Path) -> None:
    engine, backend = make(models_dir)
    chunks = list(engine.synthesize(request("x" * 30)))  # 60 tokens
    assert backend.renders == [(0, 10, False), (2, 33, False), (27, 33, False), (52, 8, True)]
    assert sum(c.size for c in chunks) == 60 * PER_TOKEN
    assert all(c.dtype == np.float32 and c.ndim == 1 for c in chunks)


def test_first_audio_leaves_after_first_chunk_tokens(models_dir: Path) -> None:
    engine, backend = make(models_dir, settings={"first_chunk_tokens": 6, "chunk_tokens": 40})
    stream = engine.synthesize(request("x" * 50))
    first = next(stream)
    assert backend.produced == 6  # the rest of the utterance is not generated yet
    assert first.size == (6 - 3) * PER_TOKEN - RATE * 40 // 1000
    second = next(stream)
    assert backend.produced == 46
    assert second.size == 40 * PER_TOKEN


def test_joins_reproduce_the_signal_without_clicks(models_dir: Path) -> None:
    engine, backend = make(models_dir)
    joined = audio(engine, "y" * 50)  # 100 tokens: five joins
    reference = sine(0, 100 * PER_TOKEN)
    assert joined.size == reference.size
    smooth_step = np.abs(np.diff(reference)).max()
    assert np.abs(np.diff(joined)).max() <= 1.2 * smooth_step
    assert np.abs(joined[PER_TOKEN:] - reference[PER_TOKEN:]).max() < 0.05
    naive = np.concatenate(  # each chunk rendered on its own and butted together
        [backend.render(FakeConds("x"), range(a, b), True) for a, b in ((0, 11), (11, 35))]
    )
    assert np.abs(np.diff(naive)).max() > 10 * smooth_step


def test_request_overrides_reach_the_token_loop(models_dir: Path) -> None:
    engine, backend = make(models_dir, settings={"min_p": 0.1, "max_new_tokens": 500})
    audio(engine, "defaults")
    audio(engine, "custom", exaggeration=1.2, cfg_weight=0.0, temperature=0.3)
    defaults, custom = (call.sampling for call in backend.token_calls)
    assert defaults == Sampling(0.5, 0.5, 0.8, 0.1, 1.0, 1.2, 500)
    assert custom == Sampling(1.2, 0.0, 0.3, 0.1, 1.0, 1.2, 500)


def test_empty_text_yields_nothing(models_dir: Path) -> None:
    engine, backend = make(models_dir)
    assert audio(engine, "  \n").size == 0
    assert backend.token_calls == []


def test_should_stop_ends_the_token_loop(models_dir: Path) -> None:
    engine, backend = make(models_dir)
    stop = threading.Event()
    stream = engine.synthesize(request("z" * 100, should_stop=stop.is_set))
    next(stream)
    stop.set()
    assert list(stream) == []
    assert backend.produced == 10  # not one token after the flag
    assert backend.closed == 1
    assert backend.renders == [(0, 10, False)]  # and no final rendering


def test_closing_the_stream_ends_the_token_loop(models_dir: Path) -> None:
    engine, backend = make(models_dir)
    stream = engine.synthesize(request("z" * 100))
    next(stream)
    stream.close()  # type: ignore[attr-defined]
    assert (backend.produced, backend.closed) == (10, 1)


def test_concurrent_streams_interleave_token_by_token(models_dir: Path) -> None:
    """Two streams take the model in turns, one step each. Each step keeps its turn until
    the other stream has asked for the next (or has ended), so the order tested is the
    lock's, not the OS scheduler's: a stream descheduled for a few steps took several in a
    row before (1 run in 20 on a loaded machine)."""
    engine, backend = make(models_dir)
    turns = TakingTurns(engine._gpu)
    backend.hold = turns.hold
    start = threading.Barrier(2)

    def run(text: str) -> None:
        start.wait()
        try:
            audio(engine, text)
        finally:
            turns.done()

    threads = [threading.Thread(target=run, args=(t * 20,)) for t in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    steps = "".join(text[0] for text in backend.steps)
    assert sorted(steps) == ["a"] * 40 + ["b"] * 40
    middle = steps[4:-4]
    longest = max(len(run) for run in middle.replace("ab", "a b").replace("ba", "b a").split())
    assert longest <= 3, steps


# --- voices and their conditioning --------------------------------------------------


def test_voices_are_builtin_plus_clips(models_dir: Path, voices_dir: Path) -> None:
    engine, _ = make(models_dir, voices_dir)
    assert engine.voices() == ["alice", "bob", "default"]
    assert all(engine.has_voice(v) for v in ("alice", "bob", "default"))
    assert not any(engine.has_voice(v) for v in ("carol", "bad name", "../voices/alice", ""))
    bare, _ = make(models_dir, voices_dir, builtin=False)
    assert bare.voices() == ["alice", "bob"]
    assert not bare.has_voice("default")
    with pytest.raises(UnknownVoice):
        bare.synthesize(request("hi"))


@pytest.mark.parametrize("voice", ["carol", "bad name", "../voices/alice", ""])
def test_unknown_voice_is_refused_before_streaming(
    models_dir: Path, voices_dir: Path, voice: str
) -> None:
    engine, backend = make(models_dir, voices_dir, builtin=False)
    with pytest.raises(UnknownVoice):
        engine.synthesize(request("hi", voice))
    assert backend.prepared == []


def test_each_voice_is_conditioned_once(models_dir: Path, voices_dir: Path) -> None:
    engine, backend = make(models_dir, voices_dir)
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
        thread.join(10)
    assert sorted(backend.prepared) == ["alice", "bob"]
    assert len(backend.token_calls) == 16
    engine.forget_voice("alice")
    audio(engine, "hello", "alice")
    assert sorted(backend.prepared) == ["alice", "alice", "bob"]


def test_concurrent_requests_use_their_own_conditioning(models_dir: Path, voices_dir: Path) -> None:
    engine, backend = make(models_dir, voices_dir)
    voices = ["alice", "bob", "default"] * 2
    start = threading.Barrier(len(voices))

    def run(voice: str) -> None:
        start.wait()
        for _ in range(3):
            audio(engine, f"spoken by {voice}", voice, exaggeration=0.9)

    threads = [threading.Thread(target=run, args=(voice,)) for voice in voices]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(backend.token_calls) == 3 * len(voices)
    for call in backend.token_calls:
        assert call.text == f"spoken by {call.voice}"
        assert call.sampling.exaggeration == 0.9


def test_library_voice_speaks_with_its_clip(models_dir: Path, tmp_path: Path) -> None:
    engine, backend = make(models_dir)
    clip = tmp_path / "library" / "v_123.wav"
    voice = engine.library_voice(LibraryVoice("v_123", clip))
    assert voice == "v_123"
    audio(engine, "hello", voice)
    assert backend.prepared == ["v_123"]
    assert backend.token_calls[-1].voice == "v_123"
    assert "v_123" not in engine.voices() and not engine.has_voice("v_123")
    engine.forget_voice("v_123")
    with pytest.raises(UnknownVoice):
        engine.synthesize(request("hello", "v_123"))


# --- the real backend's module, as far as it goes without torch -----------------------


@pytest.mark.skipif(
    importlib.util.find_spec("chatterbox") is not None, reason="chatterbox-tts is installed"
)
def test_without_chatterbox_installed_load_names_the_fix(models_dir: Path) -> None:
    settings = ChatterboxSettings(models_dir=models_dir, device="cpu")
    engine = ChatterboxEngine(settings)  # the real factory
    with pytest.raises(EngineUnavailable, match="make install-gpu"):
        engine.load()


def test_t3_precision_choice() -> None:
    from services.tts.engines.chatterbox_torch import pick_dtype

    def fake_torch(bf16: bool) -> Any:
        return types.SimpleNamespace(
            bfloat16="bf16",
            float16="fp16",
            float32="fp32",
            cuda=types.SimpleNamespace(is_bf16_supported=lambda: bf16),
        )

    assert pick_dtype(fake_torch(True), "auto", "cuda:0") == "bf16"
    assert pick_dtype(fake_torch(False), "auto", "cuda:0") == "fp32"
    assert pick_dtype(fake_torch(True), "auto", "cpu") == "fp32"
    assert pick_dtype(fake_torch(True), "float16", "cuda:0") == "fp16"


def test_warm_up_samples_as_a_request_with_the_settings_style() -> None:
    from services.tts.engines.chatterbox_torch import WARM_UP_TEXT, WARM_UP_TOKENS, TorchBackend

    class Recorded(TorchBackend):
        """Only warm_up's own logic runs: no torch, no model."""

        def __init__(self, settings: ChatterboxSettings) -> None:
            self._settings = settings
            self.builtin_conds = FakeConds("default")
            self.calls: list[tuple[str, Any]] = []

        def tokens(self, conds: Any, text: str, sampling: Sampling) -> Iterator[int]:
            self.calls.append((text, sampling))
            yield from (1, 2, 3)

        def render(self, conds: Any, tokens: Sequence[int], final: bool) -> np.ndarray:
            self.calls.append(("render", (list(tokens), final)))
            return np.zeros(0, np.float32)

    backend = Recorded(ChatterboxSettings(cfg_weight=0.0, temperature=0.3, max_new_tokens=500))
    backend.warm_up()
    assert backend.calls == [
        (WARM_UP_TEXT, Sampling(0.5, 0.0, 0.3, 0.05, 1.0, 1.2, WARM_UP_TOKENS)),
        ("render", ([1, 2, 3], True)),
    ]


class _Warming:
    """A stand-in TorchBackend for load_torch_backend: its warm-up fails when compiled."""

    made: ClassVar[list[str]] = []
    released: ClassVar[int] = 0

    def __init__(self, model: Any, settings: ChatterboxSettings, device: str) -> None:
        self.model, self.settings = model, settings
        _Warming.made.append(settings.compile_mode)

    def warm_up(self) -> None:
        if self.settings.compile_mode != "off":
            raise RuntimeError("Dynamo failed to run FX node")


@pytest.fixture
def warming(monkeypatch: pytest.MonkeyPatch) -> type[_Warming]:
    """load_torch_backend over a fake `chatterbox.tts` and the failing-when-compiled backend."""
    import services.tts.engines.chatterbox_torch as chatterbox_torch

    upstream = types.ModuleType("chatterbox.tts")
    upstream.ChatterboxTTS = types.SimpleNamespace(  # type: ignore[attr-defined]
        from_local=lambda folder, device: ("model", folder, device)
    )
    monkeypatch.setitem(sys.modules, "chatterbox", types.ModuleType("chatterbox"))
    monkeypatch.setitem(sys.modules, "chatterbox.tts", upstream)
    monkeypatch.setattr(chatterbox_torch, "TorchBackend", _Warming)

    def released() -> None:
        _Warming.released += 1

    monkeypatch.setattr(chatterbox_torch, "release_compiled", released)
    _Warming.made, _Warming.released = [], 0
    return _Warming


def test_a_step_that_fails_to_compile_is_served_eager(
    warming: type[_Warming], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from services.tts.engines.chatterbox_torch import load_torch_backend

    settings = ChatterboxSettings(compile_mode="reduce-overhead")
    with caplog.at_level(logging.WARNING):
        backend: Any = load_torch_backend(tmp_path, "cuda:0", settings)
    assert warming.made == ["reduce-overhead", "off"]
    assert warming.released == 1  # what the failed compilation held is let go first
    assert backend.settings.compile_mode == "off"
    assert backend.model == ("model", tmp_path, "cuda:0")  # the same model, not loaded again
    assert "failed at warm-up (RuntimeError: Dynamo failed" in caplog.text
    assert settings.compile_mode == "reduce-overhead"  # the caller's settings are untouched


def test_an_eager_warm_up_failure_is_not_retried(
    warming: type[_Warming], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from services.tts.engines.chatterbox_torch import load_torch_backend

    def out_of_memory(self: _Warming) -> None:
        raise OSError("OOM")

    monkeypatch.setattr(_Warming, "warm_up", out_of_memory)
    with pytest.raises(OSError, match="OOM"):
        load_torch_backend(tmp_path, "cuda:0", ChatterboxSettings())
    assert warming.made == ["off"]
    assert warming.released == 0
