"""Settings of the full-duplex service (Moshi-family speech-to-speech, batched)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from services.common.service.profiles import with_defaults
from services.common.service.settings import BaseServiceSettings, EngineSection, ServerSettings


class MoshiSettings(BaseModel):
    """A pulled Moshi checkpoint (Mimi + the Moshi LM) run by the `moshi` package."""

    model: str = "moshiko-pytorch-bf16"
    """Model name as `voice-agent models pull` names it, or a folder path holding
    `model.safetensors`, the Mimi `tokenizer-*.safetensors`, the text tokenizer
    `tokenizer_spm_32k_3.model` and optionally `config.json`."""
    models_dir: Path = Path("models")
    """Where pulled models live: `<models_dir>/<model>`."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Device; `auto` uses CUDA when torch sees a GPU."""
    gpu: int | None = Field(default=None, ge=0, le=63)
    """Physical GPU this service owns (nvidia-smi numbering): pins CUDA_VISIBLE_DEVICES to it
    when unset, so the model runs on cuda:0; unset: `device_index` among the visible GPUs."""
    device_index: int = Field(default=0, ge=0, le=63)
    """GPU index as this process sees it (after CUDA_VISIBLE_DEVICES); ignored when `gpu` is set."""
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    """Precision of the LM; `auto`: bfloat16 on CUDA, float32 on the CPU."""


class RandomMoshiSettings(BaseModel):
    """`moshi-random`: Mimi and the Moshi LM built from the package's own classes with random
    weights at a small size. Its speech is noise: for tests, benchmarks and smoke runs."""

    codebooks: int = Field(default=4, ge=1, le=32)
    """Audio codebooks per stream (the real Moshi: 8; its LM models the user's and its own)."""
    card: int = Field(default=64, ge=8, le=4096)
    """Entries per codebook (the real Mimi: 2048)."""
    dim: int = Field(default=32, ge=8, le=8192)
    """Width of the LM's transformer (the real Moshi: 4096)."""
    layers: int = Field(default=2, ge=1, le=64)
    """Layers of the LM's transformer (the real Moshi: 32)."""
    heads: int = Field(default=2, ge=1, le=64)
    """Attention heads of the LM's transformer (the real Moshi: 32)."""
    context: int = Field(default=100, ge=8, le=10_000)
    """Steps the LM attends back over (the real Moshi: 3000, 4 min at 12.5 Hz)."""
    mimi_dim: int = Field(default=32, ge=8, le=1024)
    """Width of Mimi's encoder/decoder and its transformers (the real Mimi: 512)."""
    mimi_filters: int = Field(default=4, ge=1, le=128)
    """Filters of Mimi's first convolution (the real Mimi: 64)."""
    text_vocab: int = Field(default=48, ge=16, le=4000)
    """Pieces of the SentencePiece text tokenizer trained for it at load (at most what its
    small corpus allows)."""
    seed: int = Field(default=0, ge=0)
    """Seed of the random weights: the same seed builds the same model."""


class FakeDuplexSettings(BaseModel):
    """The `fake` engine (no torch): it answers each 80 ms frame with the user's previous
    frame scaled by `gain`, and a text token every `text_every` frames."""

    gain: float = Field(default=0.5, ge=0.0, le=1.0)
    """Level of the echo."""
    text_every: int = Field(default=5, ge=1, le=1000)
    """A text piece every this many frames of a session."""
    step_ms: float = Field(default=0.0, ge=0.0, le=10_000.0)
    """Time one batched step takes, whatever the batch (0: instant)."""


class DuplexServerSettings(ServerSettings):
    """Where the duplex service listens: port 8003 unless set (its own class, so that setting
    only `VA_DUPLEX__SERVER__HOST` keeps the port, as for the ASR and TTS)."""

    port: int = Field(default=8003, ge=1, le=65535)
    """TCP port."""


class DuplexSection(EngineSection):
    """The duplex service proper."""

    engine: str = "moshi"
    """Engine name: `moshi` (a pulled checkpoint), `moshi-random` (random weights, small) or
    `fake` (an echo, no model)."""
    moshi: MoshiSettings = MoshiSettings()
    """The `moshi` engine."""
    random: RandomMoshiSettings = RandomMoshiSettings()
    """The `moshi-random` engine."""
    fake: FakeDuplexSettings = FakeDuplexSettings()
    """The `fake` engine."""
    server: DuplexServerSettings = DuplexServerSettings()
    """Where the service listens."""
    max_sessions: int = Field(default=5, ge=1, le=256)
    """Sessions served at once: the batch the model steps every 80 ms frame. One more is
    refused with close 1013 and a retry hint."""
    gather_ms: float = Field(default=20.0, ge=0.0, le=10_000.0)
    """When some live sessions have a frame ready and others not yet, how long a step waits
    for the rest before it runs without them (their state waits for their next step)."""
    max_input_frames: int = Field(default=25, ge=1, le=1000)
    """Frames (80 ms each) of a session's input waiting for the model; a client sending
    faster waits (backpressure), a stream must not pile up seconds of delay."""
    max_output_frames: int = Field(default=25, ge=1, le=1000)
    """Frames of a session's output waiting for its socket; a session whose client does not
    read is not stepped until it does."""
    use_sampling: bool = True
    """Sample tokens (Moshi's way); off: greedy (argmax), the same input gives the same
    output, whatever else is in the batch (the tests use this)."""
    temperature: float = Field(default=0.8, gt=0.0, le=2.0)
    """Sampling temperature of audio tokens."""
    temperature_text: float = Field(default=0.7, gt=0.0, le=2.0)
    """Sampling temperature of text tokens."""
    top_k: int = Field(default=250, ge=1, le=4096)
    """Audio tokens sampled among this many most likely."""
    top_k_text: int = Field(default=25, ge=1, le=32000)
    """Text tokens sampled among this many most likely."""
    retry_after_s: float = Field(default=5.0, ge=0.1, le=3600.0)
    """Retry hint a refused session gets (close reason and the error event)."""


class DuplexSettings(BaseServiceSettings):
    """All settings of the duplex service (env: `VA_DUPLEX__...`, `VA_REDIS__...`)."""

    duplex: DuplexSection = DuplexSection()
    """The full-duplex service."""

    @model_validator(mode="after")
    def _apply_profile(self) -> DuplexSettings:
        """`duplex`: the `moshi` engine on CUDA, physical GPU 0; `fake`: the echo engine;
        each unless set explicitly."""
        if self.profile == "fake":
            self.duplex = with_defaults(self.duplex, {"engine": "fake"})
        elif self.profile == "duplex" and self.duplex.engine == "moshi":
            defaults: dict[str, object] = {"device": "cuda"}
            if "device_index" not in self.duplex.moshi.model_fields_set:
                defaults["gpu"] = 0
            self.duplex = with_defaults(self.duplex, {"moshi": defaults})
        return self
