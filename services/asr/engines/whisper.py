"""faster-whisper (CTranslate2): the production ASR engine, batching across utterances.

`transcribe_batch` computes each utterance's log-Mel features (padded or trimmed
to Whisper's 30 s window), stacks them and runs one encoder pass, at most one
language-detection pass and one greedy decoding pass for the whole batch.
Whisper pads every input to 30 s, so a batch of N short utterances costs about
what one costs: batching is the lever (faster-whisper's own
`BatchedInferencePipeline` only batches the chunks of one file).

Decoding is the low-latency setting: greedy unless `beam_size` says otherwise,
temperature 0 with no fallback, no timestamps. Every prompt is
`<|startoftranscript|> <|lang|> <|transcribe|> <|notimestamps|>` (or
`<|startoftranscript|> <|notimestamps|>` for an English-only model), so all
prompts of a batch have the same length whatever the languages and one
`generate` call serves them all. An item without a language takes the one
Whisper detects for it; a language the model does not know is detected too.
Each item's text is capped by its own duration; generation runs to a cap set by the
encoder window alone (never by what else is in the batch), so a batched result equals the
result of transcribing the item alone: the same tokens with greedy decoding, and the same
scores up to the CPU kernels' rounding (sums over other batch shapes are not bit-identical).
Each result carries Whisper's mean token log-probability (`avg_logprob`, as faster-whisper
computes it). A runaway (a decode that reaches its item's cap: a hallucination loop) is
scored over the tokens kept, from the step logits where they were kept (finals, by default),
else over the whole generation, which overrates a loop (partials, whose scores nothing
reads). With `last_word_confidence`, generate also returns each step's logits, and each
result carries the log-probability of its last word (the sum over its tokens).

On a GPU: `gpu` (physical) or `device_index` (visible) picks the device without
ever asking for `cuda:1` in a process that sees one GPU (services/common/platform/devices.py);
`compute_type` is float16 by default (int8_float16 and int8 trade a little accuracy
for memory); `CT2_CUDA_ALLOCATOR=cub_caching` is set unless the environment says
otherwise; and `load` runs a warm-up so the first user does not pay for CUDA's lazy
initialization.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import threading
from collections.abc import Generator, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from services.asr.engines import whisper_files
from services.asr.engines.base import (
    AsrInput,
    AudioF32,
    FileRequest,
    FileTranscript,
    Interrupted,
    Transcript,
    run_steps,
)
from services.asr.engines.file import file_steps, language_hint
from services.asr.engines.whisper_files import check_cuda, model_folder
from services.asr.engines.whisper_scores import Decoded, decoded
from services.asr.settings import WhisperSettings
from services.common.audio.bandwidth import fold_phone_band, needs_fold
from services.common.errors import EngineUnavailable, InvalidAudio
from services.common.platform.devices import pin_gpu

log = logging.getLogger(__name__)

MAX_NEW_TOKENS: Final = 224
"""Whisper's own cap on the tokens of one 30 s window."""
TOKENS_PER_SECOND: Final = 12
"""Generous upper bound on speech tokens per second (covers fast CJK speech)."""
MIN_NEW_TOKENS: Final = 16
"""Token allowance every utterance gets on top of its per-second share."""
FRAMES_PER_SECOND: Final = 100
"""Whisper's log-Mel frames per second (hop of 160 samples at 16 kHz)."""
CUDA_ALLOCATOR: Final = "cub_caching"
"""CTranslate2's caching allocator: GPU memory stops growing with every new batch size."""


__all__ = ["FasterWhisperEngine"]


def max_new_tokens(duration_s: float) -> int:
    """The most tokens an utterance of this length may produce."""
    return min(MAX_NEW_TOKENS, MIN_NEW_TOKENS + math.ceil(TOKENS_PER_SECOND * duration_s))


@dataclass(frozen=True, slots=True)
class _Utterance:
    index: int
    duration_s: float
    features: AudioF32
    language: str | None


class FasterWhisperEngine:
    """One faster-whisper model; every batch is one encode and one generate."""

    name = "faster-whisper"
    sample_rate = 16000

    def __init__(
        self, settings: WhisperSettings, environ: MutableMapping[str, str] | None = None
    ) -> None:
        self.settings = settings
        self.model = settings.model
        self._environ = os.environ if environ is None else environ
        self._index = settings.device_index
        if settings.device != "cpu":  # before anything initializes CUDA in this process
            self._index = pin_gpu(
                settings.gpu, settings.device_index, self._environ, "VA_ASR__WHISPER__GPU"
            )
            self._environ.setdefault("CT2_CUDA_ALLOCATOR", CUDA_ALLOCATOR)
        auto_cuda = settings.device == "auto" and whisper_files.cuda_device_count() > 0
        cuda = settings.device == "cuda" or auto_cuda
        self._kind = "cuda" if cuda else "cpu"
        self.device = f"cuda:{self._index}" if cuda else "cpu"
        self._whisper: Any = None
        self._suppress: list[int] = []
        self._decoder: Any = None
        self._prompts: dict[str, list[int]] = {}
        self._lock = threading.Lock()

    def load(self) -> None:
        try:
            import faster_whisper
            from faster_whisper.transcribe import get_suppressed_tokens
        except ImportError as exc:
            raise EngineUnavailable(
                "faster-whisper is not installed: pip install 'voice-agent[faster-whisper]'"
            ) from exc
        folder = model_folder(self.settings)
        compute_type = whisper_files.compute_type(self.settings, self._kind)
        if self._kind == "cuda":
            check_cuda(self._index, self._environ)
        try:
            whisper = faster_whisper.WhisperModel(
                str(folder),
                device=self._kind,
                device_index=self._index,
                compute_type=compute_type,
                cpu_threads=self.settings.cpu_threads,
                local_files_only=True,
            )
        except (RuntimeError, ValueError, OSError) as exc:
            raise EngineUnavailable(
                f"cannot load the faster-whisper model at {folder}: {exc}"
            ) from exc
        self._decoder = self._tokenizer(whisper, "en")
        self._suppress = [int(t) for t in get_suppressed_tokens(self._decoder, [-1])]
        self._prompts = {}
        self._whisper = whisper
        log.info("faster-whisper %s loaded on %s (%s)", folder, self.device, compute_type)
        if self.settings.warmup:
            self._warm_up()

    def _warm_up(self) -> None:
        """The first call pays for lazy allocations and kernel loading: pay it here."""
        try:
            self.transcribe_batch([AsrInput(np.zeros(self.sample_rate, dtype=np.float32), "en")])
            self.transcribe_batch([AsrInput(np.zeros(self.sample_rate, dtype=np.float32))])
        except RuntimeError as exc:
            self._whisper = None
            raise EngineUnavailable(
                f"faster-whisper warm-up failed on {self.device}: {exc}"
            ) from exc

    def transcribe_batch_until(
        self, items: Sequence[AsrInput], stop: threading.Event
    ) -> list[Transcript]:
        """As `transcribe_batch`, giving up (Interrupted) before encoding or generating
        once `stop` is set: one encode is the longest a final waits for partials. The
        batcher calls it for batches of partials alone, which carry no last-word score
        (only the gateway's end of turn reads it, from finals): no logits are kept."""
        return self._transcribe(items, stop, scores=False)

    def transcribe_batch(self, items: Sequence[AsrInput]) -> list[Transcript]:
        return self._transcribe(items, None, scores=self.settings.last_word_confidence)

    def languages(self) -> list[str]:
        if self._whisper is None:
            raise EngineUnavailable("the faster-whisper model is not loaded")
        if not self._whisper.model.is_multilingual:
            return ["en"]
        return [str(code) for code in self._whisper.supported_languages]

    def transcribe_file(self, request: FileRequest) -> FileTranscript:
        """A whole file through faster-whisper's own timestamped decoding (services/asr/
        engines/file.py): segments, scores, words; never the streaming doors' path."""
        return run_steps(self.file_steps(request))

    def file_steps(self, request: FileRequest) -> Generator[None, None, FileTranscript]:
        """`transcribe_file` a window at a time (FileEngine.file_steps)."""
        whisper = self._whisper
        if whisper is None:
            raise EngineUnavailable("the faster-whisper model is not loaded")
        language = language_hint(request.language or self.settings.language)
        request = dataclasses.replace(
            request, audio=self._widened(_mono(request.audio), request.source_rate)
        )
        beam_size = self.settings.beam_size
        return (
            yield from file_steps(whisper, request, language, self.model, beam_size, self._lock)
        )

    def unload(self) -> None:
        """Drop the model (CTranslate2 frees its memory once nothing holds it)."""
        with self._lock:
            self._whisper = None
            self._prompts = {}

    def footprint_bytes(self) -> int:
        """About what the model holds in memory: the size of its weights file (CTranslate2
        keeps float16 weights as they are; int8 on a CPU halves them: an upper bound)."""
        try:
            return (model_folder(self.settings) / "model.bin").stat().st_size
        except (OSError, EngineUnavailable):
            return 0

    def _transcribe(
        self, items: Sequence[AsrInput], stop: threading.Event | None, scores: bool
    ) -> list[Transcript]:
        if self._whisper is None:
            raise EngineUnavailable("the faster-whisper model is not loaded")
        results: list[Transcript] = []
        batch: list[_Utterance] = []
        for index, item in enumerate(items):
            audio = self._widened(_mono(item.audio), item.source_rate)
            duration = audio.size / self.sample_rate
            language = language_hint(item.language or self.settings.language)
            results.append(Transcript(text="", language=language, duration_s=duration))
            if audio.size:
                batch.append(_Utterance(index, duration, self._features(audio), language))
        if batch:
            with self._lock:
                decoded = self._run(batch, stop, scores)
            for utterance, (text, language, mean, last) in zip(batch, decoded, strict=True):
                results[utterance.index] = Transcript(
                    text=text,
                    language=language,
                    duration_s=utterance.duration_s,
                    avg_logprob=mean,
                    last_word_logprob=last,
                )
        return results

    def _run(
        self, batch: list[_Utterance], stop: threading.Event | None, scores: bool
    ) -> list[Decoded]:
        """One encode and one generate per encoder window among the batch's items (on a
        GPU with the 30 s window: one for the whole batch)."""
        groups: dict[int, list[int]] = {}
        for i, utterance in enumerate(batch):
            groups.setdefault(self._window_frames(utterance.features.shape[1]), []).append(i)
        results: list[Decoded] = [("", "", None, None)] * len(batch)
        for frames, members in sorted(groups.items()):
            decoded = self._run_window([batch[i] for i in members], frames, stop, scores)
            for i, result in zip(members, decoded, strict=True):
                results[i] = result
        return results

    def _run_window(
        self, batch: list[_Utterance], frames: int, stop: threading.Event | None, scores: bool
    ) -> list[Decoded]:
        import ctranslate2

        model = self._whisper.model
        features = np.zeros((len(batch), batch[0].features.shape[0], frames), np.float32)
        for row, utterance in zip(features, batch, strict=True):
            row[:, : utterance.features.shape[1]] = utterance.features
        _unless_stopped(stop)
        encoded = model.encode(ctranslate2.StorageView.from_array(features))
        _unless_stopped(stop)
        languages = self._languages(encoded, [u.language for u in batch])
        limits = [max_new_tokens(u.duration_s) for u in batch]
        results = model.generate(
            encoded,
            [self._prompt(language) for language in languages],
            beam_size=self.settings.beam_size,
            # CTranslate2 generates at most max_length // 2 tokens for Whisper. The cap is
            # the window's (the same for an item alone or batched: its score never depends
            # on its neighbours); each item's text is cut to its own limit below.
            max_length=2 * max_new_tokens(frames / FRAMES_PER_SECOND),
            return_scores=True,
            return_logits_vocab=scores,
            return_no_speech_prob=True,
            suppress_blank=True,
            suppress_tokens=self._suppress,
            sampling_topk=1,
        )
        return [
            decoded(self._decoder, result, limit, language, scores)
            for result, limit, language in zip(results, limits, languages, strict=True)
        ]

    def _languages(self, encoded: Any, hints: list[str | None]) -> list[str]:
        """Each item's language: its hint when the model knows it, else Whisper's guess."""
        if not self._whisper.model.is_multilingual:
            return ["en"] * len(hints)
        known = set(self._whisper.supported_languages)
        wanted = [_known_language(hint, known) for hint in hints]
        if all(language is not None for language in wanted):
            return [language for language in wanted if language is not None]
        detected = self._whisper.model.detect_language(encoded)
        return [
            language if language is not None else str(ranked[0][0])[2:-2]
            for language, ranked in zip(wanted, detected, strict=True)
        ]

    def _prompt(self, language: str) -> list[int]:
        prompt = self._prompts.get(language)
        if prompt is None:
            tokenizer = self._tokenizer(self._whisper, language)
            prompt = [*tokenizer.sot_sequence, tokenizer.no_timestamps]
            self._prompts[language] = prompt
        return prompt

    def _tokenizer(self, whisper: Any, language: str) -> Any:
        from faster_whisper.tokenizer import Tokenizer

        multilingual = bool(whisper.model.is_multilingual)
        return Tokenizer(whisper.hf_tokenizer, multilingual, task="transcribe", language=language)

    def _widened(self, audio: AudioF32, source_rate: int | None) -> AudioF32:
        """Telephone-band speech with its top octave folded above 4 kHz (`phone_band_fold`)."""
        if not needs_fold(source_rate):
            return audio
        return fold_phone_band(audio, self.sample_rate, self.settings.phone_band_fold)

    def _features(self, audio: AudioF32) -> AudioF32:
        """The utterance's log-Mel frames (at most Whisper's 30 s), not yet padded."""
        extractor = self._whisper.feature_extractor
        mel = np.asarray(extractor(audio[: int(extractor.n_samples)]), dtype=np.float32)
        return mel[:, : int(extractor.nb_max_frames)]

    def _window_frames(self, frames: int) -> int:
        """The encoder window for an utterance of `frames`: the smallest multiple of
        `min_window_s` that reaches one second past its end (a window that ends with the
        speech makes Whisper repeat itself), at most Whisper's 30 s; an even count (the
        encoder halves it). Whole multiples keep the windows few, so a batch needs few
        encoder calls and an item's result does not depend on what it was batched with."""
        most = int(self._whisper.feature_extractor.nb_max_frames)
        least = round(self.settings.min_window_s * FRAMES_PER_SECOND)
        window = min(most, least * math.ceil((frames + FRAMES_PER_SECOND) / least))
        return window + window % 2


def _unless_stopped(stop: threading.Event | None) -> None:
    if stop is not None and stop.is_set():
        raise Interrupted


def _mono(audio: AudioF32) -> AudioF32:
    samples = np.asarray(audio, dtype=np.float32)
    if samples.ndim != 1:
        raise InvalidAudio(f"ASR input must be mono 1-D audio, got shape {samples.shape}")
    return samples


def _known_language(hint: str | None, known: set[str]) -> str | None:
    code = language_hint(hint)
    if code is None:
        return None
    if code not in known:
        log.warning("language %r is not one the model knows; detecting it instead", hint)
        return None
    return code
