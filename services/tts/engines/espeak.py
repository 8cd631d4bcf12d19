"""espeak-ng through the `espeakng-loader` wheel (ctypes): the embedded CPU TTS engine.

The library is process-global and not thread-safe: it is initialized once and every
call into it holds `_LOCK`. A synthesis runs in a short-lived thread that hands each
batch of samples to the caller's generator as espeak delivers it, so the first chunk
is out long before the text is finished; stopping the iteration aborts the synthesis
at its next batch.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from services.common.errors import EngineUnavailable, UnknownVoice
from services.tts.engines.base import AudioF32, LibraryVoice, SpeechRequest
from services.tts.settings import EspeakSettings

Pcm16 = npt.NDArray[np.int16]
Sink = Callable[[Pcm16], bool]
"""Receives one batch of samples; returns False to abort the synthesis."""

_LOCK = threading.Lock()
"""Held by every call into the library (it keeps global state)."""
_INIT_LOCK = threading.Lock()

_AUDIO_OUTPUT_SYNCHRONOUS = 2
_BUFFER_MS = 50
_INITIALIZE_DONT_EXIT = 0x8000
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_PARAM_RATE = 1
MIN_WPM, MAX_WPM = 80, 450
_SCALE = np.float32(1.0 / 32768.0)

_SynthCallback = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p
)


class _VoiceStruct(ctypes.Structure):
    """`espeak_VOICE` from speak_lib.h."""

    _fields_ = (
        ("name", ctypes.c_char_p),
        ("languages", ctypes.c_char_p),  # (priority byte, name, NUL)* NUL: reads the first
        ("identifier", ctypes.c_char_p),
        ("gender", ctypes.c_ubyte),
        ("age", ctypes.c_ubyte),
        ("variant", ctypes.c_ubyte),
        ("xx1", ctypes.c_ubyte),
        ("score", ctypes.c_int),
        ("spare", ctypes.c_void_p),
    )


class _Library:
    """The loaded, initialized library. Build it through `_library()`."""

    def __init__(self, lib_path: str, data_path: str) -> None:
        lib = ctypes.CDLL(lib_path)
        lib.espeak_Initialize.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int)
        lib.espeak_Info.restype = ctypes.c_char_p
        lib.espeak_ListVoices.argtypes = (ctypes.POINTER(_VoiceStruct),)
        lib.espeak_ListVoices.restype = ctypes.POINTER(ctypes.POINTER(_VoiceStruct))
        lib.espeak_SetVoiceByName.argtypes = (ctypes.c_char_p,)
        lib.espeak_SetParameter.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int)
        lib.espeak_Synth.argtypes = (
            *(ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int),
            *(ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p),
        )
        rate = lib.espeak_Initialize(
            _AUDIO_OUTPUT_SYNCHRONOUS, _BUFFER_MS, data_path.encode(), _INITIALIZE_DONT_EXIT
        )
        if rate <= 0:
            raise EngineUnavailable(f"espeak-ng failed to initialize with data at {data_path}")
        self._lib = lib
        self.sample_rate: int = rate
        self.version: str = (lib.espeak_Info(None) or b"").decode()
        self._sink: Sink | None = None
        self._callback = _SynthCallback(self._on_audio)  # kept alive as long as the library
        lib.espeak_SetSynthCallback(self._callback)
        self.languages = self._list_languages()
        self.variants = self._list_variants()

    def _list(self, spec: _VoiceStruct | None) -> list[_VoiceStruct]:
        voices = self._lib.espeak_ListVoices(ctypes.byref(spec) if spec else None)
        found: list[_VoiceStruct] = []
        while voices[len(found)]:
            found.append(voices[len(found)].contents)
        return found

    def _list_languages(self) -> dict[str, bytes]:
        """Language id (e.g. `en-us`) → voice file identifier (e.g. `gmw/en-US`)."""
        by_id: dict[str, bytes] = {}
        for voice in self._list(None):
            by_id.setdefault((voice.languages or b"")[1:].decode(), voice.identifier or b"")
        by_id.pop("", None)
        return by_id

    def _list_variants(self) -> set[str]:
        spec = _VoiceStruct(languages=b"variant")
        ids = ((voice.identifier or b"").decode() for voice in self._list(spec))
        return {ident.removeprefix("!v/") for ident in ids if ident.startswith("!v/")}

    def _on_audio(self, wav: Any, count: int, _events: int | None) -> int:
        sink = self._sink
        if sink is None or count <= 0 or not wav:
            return 0
        return 0 if sink(np.ctypeslib.as_array(wav, shape=(count,)).copy()) else 1

    def speak(self, text: str, voice: str, wpm: int, sink: Sink) -> None:
        """Synthesize `text` (language id or `language+variant`), feeding `sink` as it goes."""
        language, _, variant = voice.partition("+")
        name = self.languages[language] + (b"+" + variant.encode() if variant else b"")
        data = text.replace("\0", " ").encode()
        with _LOCK:
            if self._lib.espeak_SetVoiceByName(name) != 0:
                raise UnknownVoice(f"espeak-ng could not select voice {voice!r}")
            self._lib.espeak_SetParameter(_PARAM_RATE, wpm, 0)
            self._sink = sink
            try:
                status = self._lib.espeak_Synth(
                    data, len(data) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None
                )
            finally:
                self._sink = None
        if status != 0:
            raise EngineUnavailable(f"espeak-ng synthesis failed with status {status}")


_instance: _Library | None = None


def _library() -> _Library:
    """The process-wide library, loaded and initialized on first use."""
    global _instance
    with _INIT_LOCK:
        if _instance is None:
            try:
                import espeakng_loader
            except ImportError as exc:
                raise EngineUnavailable(
                    "espeakng-loader is not installed: pip install 'voice-agent[lite]'"
                ) from exc
            paths = (espeakng_loader.get_library_path(), espeakng_loader.get_data_path())
            try:
                _instance = _Library(*paths)
            except OSError as exc:
                raise EngineUnavailable(f"cannot load espeak-ng from {paths[0]}: {exc}") from exc
        return _instance


class _Handoff:
    """Passes sample batches from the synthesis thread to the consuming generator.

    Unbounded, but bounded by the request: at most the whole utterance, which the
    service caps through its input-length limit (espeak makes it ~1000× real time).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._parts: list[Pcm16] = []
        self._done = False
        self._cancelled = False
        self._error: Exception | None = None

    def push(self, part: Pcm16) -> bool:
        with self._cond:
            if not self._cancelled:
                self._parts.append(part)
                self._cond.notify()
            return not self._cancelled

    def close(self, error: Exception | None = None) -> None:
        with self._cond:
            self._done, self._error = True, error
            self._cond.notify()

    def cancel(self) -> None:
        with self._cond:
            self._cancelled = True

    def take(self) -> list[Pcm16] | None:
        """Wait for samples; None once the synthesis is over and everything was taken."""
        with self._cond:
            self._cond.wait_for(lambda: bool(self._parts) or self._done)
            if self._error is not None:
                raise self._error
            parts, self._parts = self._parts, []
            return parts or None


def _chunks(parts: Iterator[list[Pcm16]], size: int) -> Iterator[AudioF32]:
    """Regroup sample batches into float32 chunks of exactly `size` (the last may be short)."""
    pending = np.zeros(0, np.int16)
    for batch in parts:
        pending = np.concatenate([pending, *batch])
        full = pending.size - pending.size % size
        for start in range(0, full, size):
            yield _to_float(pending[start : start + size])
        pending = pending[full:]
    if pending.size:
        yield _to_float(pending)


def _to_float(samples: Pcm16) -> AudioF32:
    return samples.astype(np.float32) * _SCALE


class EspeakEngine:
    """espeak-ng voices: `<language>` or `<language>+<variant>`, e.g. `en-us+klatt2`."""

    name = "espeak"
    device = "cpu"

    def __init__(self, settings: EspeakSettings, chunk_ms: int = 200) -> None:
        self._settings = settings
        self._chunk_ms = chunk_ms
        self.default_voice = settings.default_voice
        self.sample_rate = 22050
        self.model = "espeak-ng"

    def load(self) -> None:
        """Initialize the library (once per process) and check the default voice."""
        lib = _library()
        self.sample_rate = lib.sample_rate
        self.model = f"espeak-ng {lib.version}"
        if not self._known(lib, self.default_voice):
            raise EngineUnavailable(
                f"espeak-ng has no voice {self.default_voice!r}: set VA_TTS__ESPEAK__DEFAULT_VOICE"
                " to a listed voice such as 'en-us+klatt2'"
            )

    def voices(self) -> list[str]:
        """Every language, and every English language with every variant.

        Any `<language>+<variant>` pair is accepted; the list leaves out the
        non-English pairs only to stay readable.
        """
        lib = _library()
        english = [language for language in lib.languages if language.startswith("en")]
        pairs = (f"{language}+{variant}" for language in english for variant in lib.variants)
        return sorted([*lib.languages, *pairs])

    def has_voice(self, voice: str) -> bool:
        """Any `<language>` or `<language>+<variant>` espeak-ng knows, listed or not."""
        return self._known(_library(), voice)

    def library_voice(self, voice: LibraryVoice) -> str:
        """espeak cannot clone a voice: a library voice speaks with its stored
        `espeak_voice`, or with the default voice when it has none."""
        chosen = voice.espeak_voice or self.default_voice
        if not self._known(_library(), chosen):
            raise UnknownVoice(f"voice {voice.id!r} names unknown espeak voice {chosen!r}")
        return chosen

    def prepare_voice(self, voice: str) -> None:
        """Nothing to prepare: espeak voices are built in."""

    def forget_voice(self, voice: str) -> None:
        """Nothing cached."""

    def synthesize(self, request: SpeechRequest) -> Iterator[AudioF32]:
        """Check the voice now; the returned iterator streams the audio."""
        lib = _library()
        voice = request.voice or self.default_voice
        if not self._known(lib, voice):
            raise UnknownVoice(f"unknown espeak voice {voice!r}")
        text = request.text.strip()
        wpm = round(self._settings.words_per_minute * request.speed)
        wpm = min(max(wpm, MIN_WPM), MAX_WPM)
        size = max(1, lib.sample_rate * self._chunk_ms // 1000)
        return self._stream(lib, text, voice, wpm, size) if text else iter(())

    @staticmethod
    def _known(lib: _Library, voice: str) -> bool:
        language, plus, variant = voice.partition("+")
        return language in lib.languages and (not plus or variant in lib.variants)

    @staticmethod
    def _stream(lib: _Library, text: str, voice: str, wpm: int, size: int) -> Iterator[AudioF32]:
        handoff = _Handoff()

        def produce() -> None:
            try:
                lib.speak(text, voice, wpm, handoff.push)
            except Exception as exc:
                handoff.close(exc)
            else:
                handoff.close()

        worker = threading.Thread(target=produce, name="espeak-synth", daemon=True)
        worker.start()
        try:
            yield from _chunks(iter(handoff.take, None), size)
        finally:
            handoff.cancel()
            worker.join()
