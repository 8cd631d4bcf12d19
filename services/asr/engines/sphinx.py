"""pocketsphinx 5: the embedded ASR engine (CPU, offline; its wheel carries US English)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from services.asr.engines.base import AsrInput, Interrupted, Transcript
from services.asr.settings import SphinxSettings
from services.common.audio import float_to_pcm16
from services.common.errors import EngineUnavailable


class SphinxEngine:
    """Transcribes utterances one after another with one pocketsphinx decoder."""

    name = "sphinx"
    sample_rate = 16000
    device = "cpu"
    sequential = True

    def __init__(self, settings: SphinxSettings) -> None:
        self.settings = settings
        self.model = str(settings.hmm) if settings.hmm else "pocketsphinx en-us"
        self._decoder: Any = None
        self._sliced_decoder: Any = None  # partials: all their decoder state stays apart
        self._lock = threading.Lock()

    def load(self) -> None:
        try:
            from pocketsphinx import Decoder
        except ImportError as exc:
            raise EngineUnavailable(
                "pocketsphinx is not installed: pip install 'voice-agent[lite]'"
            ) from exc
        options: dict[str, Any] = {
            "samprate": self.sample_rate,
            "logfn": "/dev/null",
            "dither": True,  # digital silence upsets its feature normalization
        }
        for key, value in (
            ("hmm", self.settings.hmm),
            ("dict", self.settings.dict_path),
            ("lm", self.settings.lm),
            ("jsgf", self.settings.jsgf),
        ):
            if value is not None:
                if not value.exists():
                    raise EngineUnavailable(f"pocketsphinx {key} not found at {value}")
                options[key] = str(value)
        if self.settings.jsgf is not None:
            options.pop("lm", None)
        self._decoder = Decoder(**options)
        self._sliced_decoder = Decoder(**options)

    def transcribe_batch(self, items: Sequence[AsrInput]) -> list[Transcript]:
        if self._decoder is None:
            raise EngineUnavailable("the pocketsphinx model is not loaded")
        with self._lock:
            return [self._transcribe(item) for item in items]

    def transcribe_batch_until(
        self, items: Sequence[AsrInput], stop: threading.Event
    ) -> list[Transcript]:
        """Decode in 100 ms slices, giving up (Interrupted) within one slice of `stop`.

        Sliced decoding normalizes features on the fly instead of over the whole
        utterance, so it is for partial transcripts; finals use `transcribe_batch`. It
        has a decoder of its own, so it never shifts the finals' running feature state.
        """
        if self._decoder is None:
            raise EngineUnavailable("the pocketsphinx model is not loaded")
        with self._lock:
            return [self._transcribe(item, stop) for item in items]

    def _transcribe(self, item: AsrInput, stop: threading.Event | None = None) -> Transcript:
        duration = item.audio.size / self.sample_rate
        if item.audio.size < self.sample_rate // 10:
            return Transcript(text="", language="en", duration_s=duration)
        pad = np.zeros(self.sample_rate // 4, dtype=np.float32)  # room for its endpointing
        pcm = float_to_pcm16(np.concatenate([pad, item.audio.astype(np.float32), pad]))
        text = self._decode_whole(pcm) if stop is None else self._decode_sliced(pcm, stop)
        return Transcript(text=text, language="en", duration_s=duration)

    def _decode_whole(self, pcm: bytes) -> str:
        """The whole utterance at once: features normalized over all of it (finals)."""
        decoder = self._decoder
        decoder.start_utt()
        decoder.process_raw(pcm, False, True)
        decoder.end_utt()
        return _text(decoder)

    def _decode_sliced(self, pcm: bytes, stop: threading.Event) -> str:
        """100 ms at a time on the partials' decoder, from the feature means the finals'
        decoder has learned; Interrupted within one slice of `stop`."""
        decoder = self._sliced_decoder
        decoder.set_cmn(self._decoder.get_cmn())
        step = 2 * self.sample_rate // 10  # bytes of PCM16
        decoder.start_utt()
        for start in range(0, len(pcm), step):
            if stop.is_set():
                decoder.end_utt()
                raise Interrupted
            decoder.process_raw(pcm[start : start + step], False, False)
        decoder.end_utt()
        return _text(decoder)


def _text(decoder: Any) -> str:
    hyp = decoder.hyp()
    return hyp.hypstr.strip() if hyp is not None else ""
