"""Settings of the TTS service."""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal

from pydantic import BaseModel, Field, model_validator

from services.common.service.profiles import apply_profile
from services.common.service.settings import BaseServiceSettings, EngineSection, ServerSettings

TOKEN_MS: Final = 40
"""chatterbox makes 25 speech tokens per second of audio."""
S3GEN_LOOKAHEAD_TOKENS: Final = 3
"""S3Gen renders no audio for the last 3 tokens of a segment that is not the last one."""
S3GEN_FADE_TOKENS: Final = 1
"""S3Gen silences and fades in the first 40 ms of every segment it renders."""


class EspeakSettings(BaseModel):
    """espeak-ng through the espeakng-loader wheel: the embedded engine."""

    default_voice: str = "en-us"
    """Voice used when a request names none."""
    words_per_minute: int = Field(default=160, ge=80, le=450)
    """Speaking rate at speed 1.0."""


class PiperSettings(BaseModel):
    """Piper (piper-tts on onnxruntime): the default CPU voice."""

    default_voice: str = "joe"
    """Voice when a request names none: `joe` (en_US-joe-medium, built in) or a voice added
    to `voices_dir`."""
    voices_dir: Path = Path("voices/piper")
    """Extra Piper voices: `<name>.onnx` with its `<name>.onnx.json`, spoken as `<name>`."""
    threads: int = Field(default=2, ge=0, le=64)
    """onnxruntime threads per synthesis (0: every core); `max_concurrent` run at once.
    Two halve a lone synthesis's time on a 2-core machine (first audio 125 → 73 ms); the
    threads sleep instead of spinning when idle, so more streams than cores share fairly."""
    volume: float = Field(default=1.5, gt=0.0, le=4.0)
    """Gain on the voice's output (Piper voices peak near 0.6; clipped at full scale)."""
    first_piece_words: int = Field(default=4, ge=1, le=200)
    """A first sentence longer than this is cut early, so the first audio leaves sooner: at
    its first comma (or ; : —), else before a word that starts a phrase (near, and...)."""
    max_piece_words: int = Field(default=20, ge=2, le=500)
    """A later sentence longer than this is cut at its clause boundaries."""
    clause_pause_ms: int = Field(default=120, ge=0, le=1000)
    """Silence kept at a cut after a comma (a voice ends every piece with about 200 ms)."""
    phrase_pause_ms: int = Field(default=30, ge=0, le=1000)
    """Silence kept at a cut between two words (the first sentence's early cut)."""
    noise_w_scale: float | None = Field(default=None, ge=0.0, le=2.0)
    """How much phoneme durations vary from one synthesis to the next (unset: the voice's
    own, 0.8 for most; 0: the same text always takes exactly as long)."""


class FakeTtsSettings(BaseModel):
    """The `fake` engine: an instant quiet tone as long as the text would take to say."""

    ms_per_word: float = Field(default=300.0, ge=1.0, le=10_000.0)
    """Audio per word of text at speed 1.0 (300 ms: 200 words per minute)."""
    sample_rate: int = Field(default=24000, ge=8000, le=48000)
    """Rate the engine makes audio at (the service resamples to the rate asked for)."""
    tone_hz: float = Field(default=440.0, ge=20.0, le=4000.0)
    """Frequency of the tone."""
    level_dbfs: float = Field(default=-30.0, ge=-80.0, le=-3.0)
    """Peak level of the tone (quiet, but not silence: clients can tell audio came)."""
    first_chunk_latency_ms: float = Field(default=0.0, ge=0.0, le=60_000.0)
    """Wait before the first chunk of every request (0: instant)."""


class ChatterboxSettings(BaseModel):
    """chatterbox-tts, streamed: speech tokens in chunks, each vocoded with left context."""

    model: str = "chatterbox"
    """Model name (as `voice-agent models pull` names it) or a folder path."""
    models_dir: Path = Path("models")
    """Where pulled models live: `<models_dir>/<model>`."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Device; `auto` uses CUDA when torch sees a GPU."""
    gpu: int | None = Field(default=None, ge=0, le=63)
    """Physical GPU this service owns (nvidia-smi numbering): pins CUDA_VISIBLE_DEVICES to it
    when unset, so the model runs on cuda:0; unset: `device_index` among the visible GPUs."""
    device_index: int = Field(default=0, ge=0, le=63)
    """GPU index as this process sees it (after CUDA_VISIBLE_DEVICES); ignored when `gpu` is set."""
    allow_download: bool = False
    """Download from the Hub at start-up if missing (off: fail with the fix)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Precision of the token model (T3); `auto`: bfloat16 where the GPU supports it."""
    compile_mode: Literal["off", "default", "reduce-overhead", "max-autotune"] = "off"
    """torch.compile the token model's step (`reduce-overhead` uses CUDA graphs: the dual-gpu
    default); GPU only. A step that fails to compile at warm-up is served eager, with a warning."""
    watermark: bool = True
    """Apply chatterbox's Perth watermark to every rendered segment, as upstream does."""
    exaggeration: float = Field(default=0.5, ge=0.0, le=2.0)
    """Default emotion exaggeration."""
    cfg_weight: float = Field(default=0.5, ge=0.0, le=2.0)
    """Default classifier-free guidance weight (0 turns guidance off: half the token work)."""
    temperature: float = Field(default=0.8, ge=0.05, le=2.0)
    """Default sampling temperature."""
    min_p: float = Field(default=0.05, ge=0.0, le=1.0)
    """Min-p sampling threshold."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Top-p (nucleus) sampling threshold; 1 keeps every token."""
    repetition_penalty: float = Field(default=1.2, ge=1.0, le=3.0)
    """Penalty on speech tokens already generated."""
    max_new_tokens: int = Field(default=1000, ge=10, le=4000)
    """Most speech tokens for one request (25 per second of audio: 1000 is 40 s)."""
    first_chunk_tokens: int = Field(default=10, ge=S3GEN_LOOKAHEAD_TOKENS + 1, le=500)
    """Tokens before the first audio is rendered: small, so the first audio leaves early."""
    chunk_tokens: int = Field(default=25, ge=S3GEN_LOOKAHEAD_TOKENS + 1, le=1000)
    """Tokens per later chunk (25 = 1 s of audio)."""
    context_tokens: int = Field(default=8, ge=0, le=200)
    """Tokens before a chunk re-rendered with it for continuity (their audio is dropped)."""
    overlap_ms: int = Field(default=40, ge=0, le=500)
    """Cross-fade between consecutive chunks' renderings of the same stretch of audio."""

    @model_validator(mode="after")
    def _context_covers_the_join(self) -> ChatterboxSettings:
        needed = self.overlap_ms + TOKEN_MS * (S3GEN_LOOKAHEAD_TOKENS + S3GEN_FADE_TOKENS)
        if self.context_tokens * TOKEN_MS < needed:
            raise ValueError(
                f"context_tokens={self.context_tokens} ({self.context_tokens * TOKEN_MS} ms) must "
                f"cover overlap_ms plus {needed - self.overlap_ms} ms S3Gen leaves out at a "
                f"chunk's edges: at least {-(-needed // TOKEN_MS)} tokens"
            )
        return self


class VoiceLibrarySettings(BaseModel):
    """Uploaded reference clips (`/v1/voices`): files on disk, metadata in Redis."""

    dir: Path = Path("var/voices")
    """Folder of the clips (`<id>.wav`); other hosts fetch a missing clip from Redis."""
    max_upload_mb: float = Field(default=10.0, ge=0.1, le=200.0)
    """Largest upload accepted."""
    min_duration_s: float = Field(default=3.0, ge=0.5, le=60.0)
    """Shortest clip accepted."""
    max_duration_s: float = Field(default=30.0, ge=1.0, le=300.0)
    """Longest clip accepted."""
    min_rms_dbfs: float = Field(default=-40.0, ge=-90.0, le=-3.0)
    """Quietest clip accepted (RMS level in dBFS): below it a clip counts as silent."""
    max_clipped_fraction: float = Field(default=0.01, ge=0.0, le=1.0)
    """Largest share of samples at full scale before a clip counts as clipped."""
    max_voices: int = Field(default=1000, ge=1, le=1_000_000)
    """Most voices in the library."""
    sample_rate: int = Field(default=24000, ge=8000, le=48000)
    """Rate of the stored clips (chatterbox's own)."""

    @property
    def max_upload_bytes(self) -> int:
        """`max_upload_mb` in bytes."""
        return int(self.max_upload_mb * 1024 * 1024)

    @model_validator(mode="after")
    def _durations_in_order(self) -> VoiceLibrarySettings:
        if self.min_duration_s >= self.max_duration_s:
            raise ValueError("min_duration_s must be below max_duration_s")
        return self


class TtsServerSettings(ServerSettings):
    """Where the TTS service listens: port 8002 unless set. (Its own class, not a
    `ServerSettings(port=8002)` default, so that setting only `VA_TTS__SERVER__HOST` keeps
    the port: settings from the environment build the section anew from its class.)"""

    port: int = Field(default=8002, ge=1, le=65535)
    """TCP port."""


class TtsSection(EngineSection):
    """The TTS service proper."""

    engine: str = "piper"
    """Engine name: `piper`, `espeak`, `chatterbox` or `fake`."""
    piper: PiperSettings = PiperSettings()
    """Piper settings."""
    espeak: EspeakSettings = EspeakSettings()
    """espeak-ng settings."""
    chatterbox: ChatterboxSettings = ChatterboxSettings()
    """chatterbox settings."""
    fake: FakeTtsSettings = FakeTtsSettings()
    """Settings of the `fake` engine (no model: a tone)."""
    voices: VoiceLibrarySettings = VoiceLibrarySettings()
    """The voice library."""
    server: TtsServerSettings = TtsServerSettings()
    """Where the service listens."""
    max_concurrent: int = Field(default=2, ge=1, le=256)
    """Syntheses running at once in this process."""
    max_queue: int = Field(default=256, ge=1, le=100_000)
    """Most requests waiting; more are refused with `capacity`."""
    max_input_chars: int = Field(default=4096, ge=1, le=100_000)
    """Longest text one request may carry."""
    chunk_ms: int = Field(default=200, ge=20, le=5000)
    """Size of the audio chunks sent on streams and over Redis."""


class TtsSettings(BaseServiceSettings):
    """All settings of the TTS service (env: `VA_TTS__...`, `VA_REDIS__...`)."""

    tts: TtsSection = TtsSection()
    """The TTS service."""

    @model_validator(mode="after")
    def _apply_profile(self) -> TtsSettings:
        """`dual-gpu`: chatterbox on CUDA, physical GPU 1, its token step in CUDA graphs;
        `fake`: the fake engine; each unless set explicitly.

        CUDA graphs because on one H200 (random weights of real size) the eager step made
        chatterbox slower than real time (RTF 1.35 against 0.89) and lost half its output
        with four streams interleaved (0.4 against 1.13 s of audio per second):
        benchmarks/results/gpu_h200/."""
        self.tts = apply_profile(
            self.tts,
            self.profile,
            "chatterbox",
            "chatterbox",
            gpu=1,
            gpu_defaults={"compile_mode": "reduce-overhead"},
        )
        return self
