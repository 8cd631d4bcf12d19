"""chatterbox-tts (Resemble AI): the production GPU TTS engine.

`chatterbox` and `torch` are imported inside `load`, never at module import, so the
service can list this engine in an environment without them. The model keeps the
conditioning of the voice it speaks with in its `conds` attribute, which both
`prepare_conditionals` and `generate` change: one lock guards that attribute and every
model call, and each voice's conditioning is built once and cached.
"""

from __future__ import annotations

import copy
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from services.common.errors import EngineUnavailable, UnknownVoice
from services.tts.engines.base import AudioF32, SpeechRequest
from services.tts.settings import ChatterboxSettings

DEFAULT_VOICE = "default"
REQUIRED_FILES = ("ve.safetensors", "t3_cfg.safetensors", "s3gen.safetensors", "tokenizer.json")
"""What `ChatterboxTTS.from_local` reads (`conds.pt`, the built-in voice, is optional)."""
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")

ModelFactory = Callable[[Path | None, str], Any]
"""(model folder, or None to download from the Hub; device) → a loaded ChatterboxTTS."""


def load_chatterbox(folder: Path | None, device: str) -> Any:
    """The real factory: `ChatterboxTTS.from_local`, or `from_pretrained` when folder is None."""
    try:
        from chatterbox.tts import ChatterboxTTS
    except ImportError as exc:
        raise EngineUnavailable(
            f"chatterbox-tts is not importable ({exc}): install the TTS GPU environment"
            " (make install-gpu)"
        ) from exc
    if folder is None:
        return ChatterboxTTS.from_pretrained(device)
    return ChatterboxTTS.from_local(folder, device)


def resolve_device(settings: ChatterboxSettings) -> str:
    """`cpu`, or `cuda:<device_index>` for `cuda` and for `auto` when torch sees a GPU."""
    if settings.device == "cpu":
        return "cpu"
    try:
        import torch
    except ImportError as exc:
        raise EngineUnavailable(f"torch is not importable ({exc}): install torch") from exc
    if settings.device == "auto" and not torch.cuda.is_available():
        return "cpu"
    return f"cuda:{settings.device_index}"


def to_float32(wav: Any) -> AudioF32:
    """A generated waveform ((1, N) torch tensor or numpy array) as flat float32 numpy."""
    if not isinstance(wav, np.ndarray):
        wav = wav.detach().cpu().float().numpy()
    return np.asarray(wav, dtype=np.float32).reshape(-1)


def split_chunks(audio: AudioF32, size: int) -> Iterator[AudioF32]:
    """`audio` in consecutive pieces of `size` samples (the last may be shorter)."""
    for start in range(0, audio.size, size):
        yield audio[start : start + size]


class ChatterboxEngine:
    """chatterbox voices: `default` (the model's built-in one) and `<voices_dir>/<id>.wav`."""

    name = "chatterbox"
    default_voice = DEFAULT_VOICE

    def __init__(
        self,
        settings: ChatterboxSettings,
        voices_dir: Path | None = None,
        model_factory: ModelFactory | None = None,
    ) -> None:
        self._settings = settings
        self._voices_dir = voices_dir
        self._factory = model_factory or load_chatterbox
        self._lock = threading.Lock()
        """Guards `model.conds`, every model call and `_conds`."""
        self._model: Any = None
        self._conds: dict[str, Any] = {}
        self.sample_rate: int = 24000
        self.model: str = settings.model
        self.device: str = settings.device

    def model_folder(self) -> Path:
        """`settings.model` if it is a folder, else `<models_dir>/<model>`."""
        as_path = Path(self._settings.model).expanduser()
        return as_path if as_path.is_dir() else self._settings.models_dir / self._settings.model

    def load(self) -> None:
        """Load the model from its folder (or the Hub, if allowed); fail with the fix."""
        folder = self._checked_folder()
        device = resolve_device(self._settings)
        model = self._factory(folder, device)
        with self._lock:
            self._model = model
            self._conds = {DEFAULT_VOICE: model.conds} if model.conds is not None else {}
        self.sample_rate = int(model.sr)
        self.device = device

    def _checked_folder(self) -> Path | None:
        """The complete model folder; None to download it; else EngineUnavailable."""
        folder = self.model_folder()
        fix = self._pull_hint()
        if not folder.is_dir():
            if self._settings.allow_download:
                return None
            raise EngineUnavailable(f"chatterbox model not found at {folder}: {fix}")
        for name in REQUIRED_FILES:
            if not (folder / name).is_file():
                raise EngineUnavailable(
                    f"chatterbox model at {folder} is incomplete, {name} is missing: {fix}"
                )
        return folder

    def _pull_hint(self) -> str:
        model = self._settings.model
        name = model if _SAFE_NAME.match(model) else "chatterbox"
        return (
            f"run: voice-agent models pull {name} --dir {self._settings.models_dir}"
            " (or set VA_TTS__CHATTERBOX__ALLOW_DOWNLOAD=true)"
        )

    def voices(self) -> list[str]:
        """`default` when the model has built-in conditioning, plus every reference clip."""
        with self._lock:
            ids = set(self._conds)
        if self._voices_dir is not None and self._voices_dir.is_dir():
            ids.update(p.stem for p in self._voices_dir.glob("*.wav") if _SAFE_NAME.match(p.stem))
        return sorted(ids)

    def _clip(self, voice: str) -> Path | None:
        if self._voices_dir is None or not _SAFE_NAME.match(voice):
            return None
        path = self._voices_dir / f"{voice}.wav"
        return path if path.is_file() else None

    def prepare_voice(self, voice: str) -> None:
        """Build and cache `voice`'s conditioning now (e.g. when its clip is uploaded)."""
        model = self._loaded()
        with self._lock:
            self._conditionals(model, voice)

    def forget_voice(self, voice: str) -> None:
        """Drop a cached conditioning (its clip was replaced or deleted)."""
        with self._lock:
            if voice != DEFAULT_VOICE:
                self._conds.pop(voice, None)

    def _conditionals(self, model: Any, voice: str) -> Any:
        """The cached conditioning of `voice`, built on first use. Call with the lock held."""
        if voice in self._conds:
            return self._conds[voice]
        clip = self._clip(voice)
        if clip is None:
            raise UnknownVoice(f"unknown chatterbox voice {voice!r}")
        model.prepare_conditionals(str(clip), exaggeration=self._settings.exaggeration)
        self._conds[voice] = model.conds
        return model.conds

    def _loaded(self) -> Any:
        if self._model is None:
            raise EngineUnavailable("chatterbox is not loaded: call load() first")
        return self._model

    def synthesize(self, request: SpeechRequest) -> Iterator[AudioF32]:
        """Check the request now; the returned iterator yields the audio in chunks."""
        model = self._loaded()
        voice = request.voice or DEFAULT_VOICE
        if voice not in self._conds and self._clip(voice) is None:
            raise UnknownVoice(f"unknown chatterbox voice {voice!r}")
        if not request.text.strip():
            return iter(())
        return self._stream(model, voice, request)

    def _stream(self, model: Any, voice: str, request: SpeechRequest) -> Iterator[AudioF32]:
        size = max(1, int(self.sample_rate) * self._settings.chunk_ms // 1000)
        yield from split_chunks(self._generate(model, voice, request), size)

    def _generate(self, model: Any, voice: str, request: SpeechRequest) -> AudioF32:
        """One whole utterance. Streaming token by token will replace this."""
        settings = self._settings
        options = {
            "exaggeration": _pick(request.exaggeration, settings.exaggeration),
            "cfg_weight": _pick(request.cfg_weight, settings.cfg_weight),
            "temperature": _pick(request.temperature, settings.temperature),
        }
        with self._lock:
            # generate() replaces conds.t3 when exaggeration changes: give it a copy.
            model.conds = copy.copy(self._conditionals(model, voice))
            wav = model.generate(request.text, **options)
        return to_float32(wav)


def _pick(value: float | None, default: float) -> float:
    return default if value is None else value
