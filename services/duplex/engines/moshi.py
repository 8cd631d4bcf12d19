"""The `moshi` and `moshi-random` engines: Mimi + the Moshi LM stepped over a batch of slots.

One `LMGen` and one Mimi stream the whole batch (`streaming_forever(slots)`); every step
encodes a frame for each active slot, runs one LM step for all of them and decodes what
the LM said. moshi's streaming modules carry an execution mask and a per-item reset
(`set_exec_mask`, `reset_streaming(mask)`): a slot left out of a step keeps its KV caches,
offsets and codec buffers as they were, and a slot handed to a new session is reset alone.
`LMGen(support_out_of_sync=True)` keeps one offset per slot, so sessions that joined at
different times each see their own delayed-codebook warm-up.

As moshi's reference server does, a session's first frame is encoded, then the slot's
codec state is reset and the LM does not see that frame (its left padding is
not speech).

This module imports no torch at import time: the engine loads it in `load`, and a missing
duplex environment fails there with the fix.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import numpy as np

from services.common.errors import EngineUnavailable
from services.common.platform.devices import pin_gpu
from services.duplex.engines.base import SlotOutput, StepInput, StepOutput
from services.duplex.settings import DuplexSection, MoshiSettings

log = logging.getLogger(__name__)

WARMUP_STEPS: Final = 4
UNSUPPORTED: Final = {
    "personaplex": (
        "PersonaPlex checkpoints need NVIDIA's fork of moshi: its LMGen predicts 16 audio "
        "codebooks, steps voice and text prompts before the conversation and keeps one offset "
        "for the whole batch, which the PyPI moshi this service runs (per-slot offsets, 8 "
        "codebooks) cannot drive. Run NVIDIA's server for PersonaPlex (docs/duplex.md)"
    ),
}
"""Model-name prefixes pulled for deployment that this engine refuses, and why."""

Loader = Callable[[str, Any], Any]
"""(device, torch dtype) -> MoshiModels; the torch modules are loaded lazily."""


class MoshiEngine:
    """Mimi + LMGen over `slots` slots; the models come from `loader`."""

    name = "moshi"
    sample_rate = 24000
    frame_samples = 1920

    def __init__(
        self, section: DuplexSection, loader: Loader, model: str, device_setting: MoshiSettings
    ) -> None:
        self._section = section
        self._loader = loader
        self.model = model
        self._device_setting = device_setting
        self.device = "cpu"
        self._torch: Any = None
        self._models: Any = None
        self._gen: Any = None
        self._slots = 0
        self._seen = np.zeros(0, np.int64)
        self._pad_ids: tuple[int, ...] = ()

    def load(self, slots: int) -> None:
        torch = _import("torch")
        lm_module = _import("moshi.models.lm")
        self._torch = torch
        self.device = resolve_device(self._device_setting, torch)
        dtype = _dtype(torch, self._device_setting.dtype, self.device)
        with torch.no_grad():
            models = self._loader(self.device, dtype)
            self._gen = lm_module.LMGen(
                models.lm,
                use_sampling=self._section.use_sampling,
                temp=self._section.temperature,
                temp_text=self._section.temperature_text,
                top_k=self._section.top_k,
                top_k_text=self._section.top_k_text,
                support_out_of_sync=True,
                condition_tensors=_conditions(models, slots),
            )
            self._models = models
            self.sample_rate = int(models.mimi.sample_rate)
            self.frame_samples = int(models.mimi.frame_size)
            self._slots = slots
            self._seen = np.zeros(slots, np.int64)
            self._pad_ids = (models.lm.text_padding_token_id, models.lm.end_of_text_padding_id)
            models.mimi.streaming_forever(slots)
            self._gen.streaming_forever(slots)
            self._warm_up()

    def _warm_up(self) -> None:
        """A few steps of silence on every slot, then a reset: the first user does not pay
        for the kernels' first runs (seconds on a CPU)."""
        every = np.ones(self._slots, bool)
        silence = np.zeros((self._slots, self.frame_samples), np.float32)
        for index in range(WARMUP_STEPS):
            self.step(StepInput(silence, every, every if index == 0 else ~every))
        self._reset(self._mask(every))
        self._seen[:] = 0

    def step(self, batch: StepInput) -> StepOutput:
        torch = self._torch
        if self._gen is None:
            raise EngineUnavailable("the Moshi engine is not loaded: call load() first")
        with torch.no_grad():
            return self._step(batch)

    def _step(self, batch: StepInput) -> StepOutput:
        torch, mimi, gen = self._torch, self._models.mimi, self._gen
        if batch.reset.any():
            self._reset(self._mask(batch.reset))
            self._seen[batch.reset] = 0
        first = batch.active & (self._seen == 0)
        hears = batch.active & ~first
        audio = torch.from_numpy(np.ascontiguousarray(batch.audio, np.float32))
        mimi.set_exec_mask(self._mask(batch.active))
        codes = mimi.encode(audio.to(self.device)[:, None, :])
        if first.any():  # the reference server's skip of the first frame, per slot
            mimi.reset_streaming(self._mask(first))
        self._seen[batch.active] += 1
        out: list[SlotOutput | None] = [
            SlotOutput(audio=None) if active else None for active in batch.active
        ]
        if not hears.any():
            return StepOutput(out)
        gen.set_exec_mask(self._mask(hears))
        tokens = gen.step(codes)[:, :, 0]  # [slots, 1 + dep_q]
        speech = tokens[:, 1 : 1 + mimi.num_codebooks]
        made = self._mask(hears) & (speech >= 0).all(dim=1)
        pcm = None
        if bool(made.any()):
            mimi.set_exec_mask(made)
            pcm = mimi.decode(torch.where(speech >= 0, speech, 0)[:, :, None])[:, 0]
            pcm = pcm.float().cpu().numpy()
        made_np = made.cpu().numpy()
        rows = tokens.cpu().tolist()
        for slot in np.flatnonzero(hears):
            if made_np[slot] and pcm is not None:
                row = rows[slot]
                out[slot] = SlotOutput(pcm[slot].copy(), self._text(row[0]), tuple(row))
        return StepOutput(out)

    def _text(self, token: int) -> str | None:
        if token < 0 or token in self._pad_ids:
            return None
        tokenizer = self._models.tokenizer
        if token >= tokenizer.vocab_size():
            return None
        piece: str = tokenizer.id_to_piece(token)
        return piece.replace("▁", " ")

    def _mask(self, values: Any) -> Any:
        return self._torch.as_tensor(np.asarray(values, bool), device=self.device)

    def _reset(self, mask: Any) -> None:
        self._models.mimi.reset_streaming(mask)
        self._gen.reset_streaming(mask)

    def state_bytes_per_slot(self) -> int:
        if self._gen is None or not self._slots:
            return 0
        modules = (self._models.mimi, self._gen, self._models.lm)
        return state_bytes(self._torch, modules) // self._slots


def state_bytes(torch: Any, modules: tuple[Any, ...]) -> int:
    """Bytes of the tensors held by the streaming states of `modules` (each counted once)."""
    seen: set[int] = set()
    total = 0

    def add(value: Any) -> None:
        nonlocal total
        if isinstance(value, torch.Tensor):
            key = value.untyped_storage().data_ptr() if value.device.type != "meta" else id(value)
            if key not in seen:
                seen.add(key)
                total += value.numel() * value.element_size()
        elif hasattr(value, "cache") and hasattr(value, "end_offset"):  # RingKVCache
            add(value.cache)
            add(value.end_offset)

    for module in modules:
        for state in module.get_streaming_state().values():
            for value in vars(state).values():
                add(value)
    return total


def resolve_device(settings: MoshiSettings, torch: Any, environ: Any = None) -> str:
    """`cpu`, or `cuda:<index>` for `cuda` and for `auto` when torch sees a GPU."""
    if settings.device == "cpu":
        return "cpu"
    env = os.environ if environ is None else environ
    index = pin_gpu(settings.gpu, settings.device_index, env, "VA_DUPLEX__MOSHI__GPU")
    if not torch.cuda.is_available():
        if settings.device == "auto":
            return "cpu"
        raise EngineUnavailable(
            "VA_DUPLEX__MOSHI__DEVICE=cuda but torch sees no GPU: install the CUDA build of "
            "torch (make install-duplex on the GPU host) or set VA_DUPLEX__MOSHI__DEVICE=cpu"
        )
    return f"cuda:{index}"


def _dtype(torch: Any, setting: str, device: str) -> Any:
    if setting == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return getattr(torch, setting)


def _conditions(models: Any, slots: int) -> Any:
    """Condition tensors for LMs that take them (none for Moshi itself)."""
    if models.lm.condition_provider is None:
        return None
    run_inference = _import("moshi.run_inference")
    return run_inference.get_condition_tensors(models.model_type, models.lm, slots, 1.0)


def _import(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise EngineUnavailable(
            f"the duplex engine needs torch and moshi ({exc}): run `make install-duplex` and "
            "start the service from .venv-duplex (docs/duplex.md)"
        ) from exc


def model_folder(settings: MoshiSettings) -> Path:
    """Where the `moshi` engine reads its checkpoint; a refused model name fails here."""
    for prefix, why in UNSUPPORTED.items():
        if settings.model.lower().startswith(prefix):
            raise EngineUnavailable(f"{settings.model}: {why}")
    path = Path(settings.model)
    if path.is_dir() or "/" in settings.model:
        return path
    return settings.models_dir / settings.model


def checkpoint_engine(section: DuplexSection) -> MoshiEngine:
    """The `moshi` engine: a pulled checkpoint folder, checked at load."""
    settings = section.moshi

    def load(device: str, dtype: Any) -> Any:
        folder = model_folder(settings)
        if not folder.is_dir():
            raise EngineUnavailable(
                f"Moshi model not found at {folder}: run `voice-agent models pull "
                f"{settings.model} --dir {settings.models_dir}`, set VA_DUPLEX__MOSHI__MODEL to "
                "a pulled folder, or VA_DUPLEX__ENGINE=moshi-random for a random-weight smoke model"
            )
        built = _import("services.duplex.engines.moshi_models")
        return built.load_checkpoint(folder, device, dtype)

    return MoshiEngine(section, load, settings.model, settings)


def random_engine(section: DuplexSection) -> MoshiEngine:
    """The `moshi-random` engine: small, random weights (speech is noise), float32, on the
    device `moshi.device` names."""
    settings = section.random

    def load(device: str, dtype: Any) -> Any:
        built = _import("services.duplex.engines.moshi_models")
        return built.build_random(settings, device)

    device = section.moshi.model_copy(update={"dtype": "float32"})
    engine = MoshiEngine(section, load, f"random-{settings.dim}d-{settings.layers}l", device)
    engine.name = "moshi-random"
    return engine
