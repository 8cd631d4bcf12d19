"""chatterbox-tts (Resemble AI): the production GPU TTS engine, streaming.

Upstream renders a whole utterance at once. Here the token model (T3) runs one
step at a time through a backend (`chatterbox_torch.TorchBackend` for the real
model, fakes in tests); every `first_chunk_tokens` and then every `chunk_tokens`
tokens, S3Gen renders the new tokens with `context_tokens` before them, and a
`CrossFader` joins the renderings with an `overlap_ms` cross-fade. The backend
never reads or writes the model's shared `conds`: each voice's conditioning is
built once, cached here, and passed explicitly with each call.

Concurrency: one model per process and one `FairLock` around every model step
(one T3 token step, one S3Gen render, one conditioning build). Each request runs
its own loop in its own thread and takes turns in FIFO order, so streams
interleave token by token and a new request's first chunk never waits for
another request's whole utterance. See docs/engines.md for why this and not batching.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

from services.common.errors import EngineUnavailable, UnknownVoice
from services.common.platform.devices import pin_gpu
from services.tts.engines.base import AudioF32, LibraryVoice, SpeechRequest
from services.tts.engines.chatterbox_backend import SpeechBackend, sampling_of
from services.tts.engines.streaming import CrossFader, FairLock, Segment, TokenChunker
from services.tts.settings import TOKEN_MS, ChatterboxSettings

DEFAULT_VOICE = "default"
REQUIRED_FILES = ("ve.safetensors", "t3_cfg.safetensors", "s3gen.safetensors", "tokenizer.json")
"""What `ChatterboxTTS.from_local` reads (`conds.pt`, the built-in voice, is optional)."""
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


BackendFactory = Callable[[Path | None, str, ChatterboxSettings], SpeechBackend]
"""(model folder, or None to download from the Hub; device; settings) → a loaded backend."""


def load_backend(folder: Path | None, device: str, settings: ChatterboxSettings) -> SpeechBackend:
    """The real factory: chatterbox-tts and torch (the TTS GPU environment)."""
    from services.tts.engines.chatterbox_torch import load_torch_backend

    return load_torch_backend(folder, device, settings)


def resolve_device(settings: ChatterboxSettings, environ: MutableMapping[str, str]) -> str:
    """`cpu`, or `cuda:<index>` for `cuda` and for `auto` when torch sees a GPU."""
    if settings.device == "cpu":
        return "cpu"
    index = pin_gpu(settings.gpu, settings.device_index, environ, "VA_TTS__CHATTERBOX__GPU")
    try:
        import torch
    except ImportError as exc:
        raise EngineUnavailable(f"torch is not importable ({exc}): make install-gpu") from exc
    if settings.device == "auto" and not torch.cuda.is_available():
        return "cpu"
    return f"cuda:{index}"


class ChatterboxEngine:
    """chatterbox voices: `default` (built in), `<voices_dir>/<id>.wav`, library voices."""

    name = "chatterbox"
    default_voice = DEFAULT_VOICE

    def __init__(
        self,
        settings: ChatterboxSettings,
        voices_dir: Path | None = None,
        backend_factory: BackendFactory | None = None,
        environ: MutableMapping[str, str] | None = None,
    ) -> None:
        self._settings = settings
        self._voices_dir = voices_dir
        self._factory = backend_factory or load_backend
        self._environ = os.environ if environ is None else environ
        self._gpu = FairLock()
        """Held by every model step: one at a time, in the order they were asked for."""
        self._cache = threading.Lock()
        """Guards `_conds` and `_library`."""
        self._backend: SpeechBackend | None = None
        self._conds: dict[str, Any] = {}
        self._library: dict[str, Path] = {}
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
        device = resolve_device(self._settings, self._environ)
        backend = self._factory(folder, device, self._settings)
        with self._cache:
            self._backend = backend
            builtin = backend.builtin_conds
            self._conds = {DEFAULT_VOICE: builtin} if builtin is not None else {}
        self.sample_rate = int(backend.sample_rate)
        self.device = device

    def _checked_folder(self) -> Path | None:
        """The complete model folder; None to download it; else EngineUnavailable."""
        folder = self.model_folder()
        model = self._settings.model
        name = model if _SAFE_NAME.match(model) else "chatterbox"
        fix = (
            f"run: voice-agent models pull {name} --dir {self._settings.models_dir}"
            " (or set VA_TTS__CHATTERBOX__ALLOW_DOWNLOAD=true)"
        )
        if not folder.is_dir():
            if self._settings.allow_download:
                return None
            raise EngineUnavailable(f"chatterbox model not found at {folder}: {fix}")
        for required in REQUIRED_FILES:
            if not (folder / required).is_file():
                raise EngineUnavailable(
                    f"chatterbox model at {folder} is incomplete, {required} is missing: {fix}"
                )
        return folder

    # --- voices -------------------------------------------------------------------

    def voices(self) -> list[str]:
        """`default` when the model has built-in conditioning, plus every clip in voices_dir."""
        with self._cache:
            ids = {voice for voice in self._conds if voice not in self._library}
        if self._voices_dir is not None and self._voices_dir.is_dir():
            ids.update(p.stem for p in self._voices_dir.glob("*.wav") if _SAFE_NAME.match(p.stem))
        return sorted(ids)

    def has_voice(self, voice: str) -> bool:
        """`default` (built-in conditioning) or a clip in voices_dir: no folder listing."""
        with self._cache:
            if voice in self._conds and voice not in self._library:
                return True
        return self._dir_clip(voice) is not None

    def library_voice(self, voice: LibraryVoice) -> str:
        """A library voice speaks with its own clip, under its own id."""
        with self._cache:
            self._library[voice.id] = voice.clip
        return voice.id

    def prepare_voice(self, voice: str) -> None:
        """Build and cache `voice`'s conditioning now (e.g. when its clip is uploaded)."""
        self._conditionals(self._loaded(), voice)

    def forget_voice(self, voice: str) -> None:
        """Drop a cached conditioning (its clip was replaced or deleted)."""
        with self._cache:
            self._library.pop(voice, None)
            if voice != DEFAULT_VOICE:
                self._conds.pop(voice, None)

    def _clip(self, voice: str) -> Path | None:
        with self._cache:
            if voice in self._library:
                return self._library[voice]
        return self._dir_clip(voice)

    def _dir_clip(self, voice: str) -> Path | None:
        if self._voices_dir is None or not _SAFE_NAME.match(voice):
            return None
        path = self._voices_dir / f"{voice}.wav"
        return path if path.is_file() else None

    def _conditionals(self, backend: SpeechBackend, voice: str) -> Any:
        """The cached conditioning of `voice`, built once (under the model lock) on first use."""
        with self._cache:
            if voice in self._conds:
                return self._conds[voice]
        clip = self._clip(voice)
        if clip is None:
            raise UnknownVoice(f"unknown chatterbox voice {voice!r}")
        with self._gpu:
            with self._cache:
                if voice in self._conds:  # built while this thread waited for its turn
                    return self._conds[voice]
            conds = backend.prepare(clip, self._settings.exaggeration)
            with self._cache:
                self._conds[voice] = conds
        return conds

    def _loaded(self) -> SpeechBackend:
        if self._backend is None:
            raise EngineUnavailable("chatterbox is not loaded: call load() first")
        return self._backend

    # --- synthesis ----------------------------------------------------------------

    def synthesize(self, request: SpeechRequest) -> Iterator[AudioF32]:
        """Check the request now; the returned iterator streams the audio."""
        backend = self._loaded()
        voice = request.voice or DEFAULT_VOICE
        with self._cache:
            known = voice in self._conds
        if not known and self._clip(voice) is None:
            raise UnknownVoice(f"unknown chatterbox voice {voice!r}")
        if not request.text.strip():
            return iter(())
        return self._stream(backend, voice, request)

    def _stream(
        self, backend: SpeechBackend, voice: str, request: SpeechRequest
    ) -> Iterator[AudioF32]:
        conds = self._conditionals(backend, voice)
        s = self._settings
        chunker = TokenChunker(s.first_chunk_tokens, s.chunk_tokens, s.context_tokens)
        per_token = self.sample_rate * TOKEN_MS // 1000
        fader = CrossFader(self.sample_rate * s.overlap_ms // 1000)
        stop = request.should_stop or _never
        steps = backend.tokens(conds, request.text, sampling_of(s, request))
        try:
            for token in self._token_loop(steps, stop):
                segment = chunker.push(token)
                if segment is not None:
                    rendered = self._render(backend, conds, segment)
                    audio = fader.push(segment.start * per_token, rendered, False)
                    if audio.size:
                        yield audio
            last = None if stop() else chunker.finish()
            if last is not None:
                rendered = self._render(backend, conds, last)
                yield fader.push(last.start * per_token, rendered, True)
        finally:
            close = getattr(steps, "close", None)
            if close is not None:
                close()

    def _token_loop(self, steps: Iterator[int], stop: Callable[[], bool]) -> Iterator[int]:
        """Tokens from the backend, one model step per turn; stops as soon as `stop()`."""
        while not stop():
            with self._gpu:
                token = next(steps, None)
            if token is None:
                return
            yield token

    def _render(self, backend: SpeechBackend, conds: Any, segment: Segment) -> AudioF32:
        """One S3Gen rendering, on the model in its turn."""
        with self._gpu:
            return backend.render(conds, segment.tokens, segment.final)


def _never() -> bool:
    return False
