"""The real chatterbox backend: T3 one step at a time, S3Gen per segment.

Imported only by `chatterbox.load_backend`, in the TTS GPU environment (`make
install-gpu`): torch and chatterbox-tts are not in the main environment, so nothing
here runs in the test suite; `benchmarks/chatterbox_cpu_smoke.py` runs it end to end
on CPU with random weights. It follows chatterbox-tts 0.1.7 `ChatterboxTTS.generate`
and `T3.inference` (same text normalization, classifier-free guidance as a batch of
two whose second row has its text embeddings zeroed, the same start-of-speech
prefix, repetition penalty, temperature, min-p, top-p and multinomial sampling) but
yields every token as soon as it is sampled, and renders segments on demand with
S3Gen (leaving out the audio of a non-final segment's last 3 tokens, which needs
lookahead).

Precision: T3 (the 0.5B Llama that dominates the cost) runs in `dtype` (`auto`:
bfloat16 where the GPU supports it); S3Gen and the voice encoder stay float32.
`compile_mode` other than `off` compiles T3's one-token decode step with
torch.compile over a static KV cache (`reduce-overhead` = CUDA graphs); the caches
come from a pool, so graphs are recorded once per concurrent stream, not per request.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

import numpy as np

from services.common.errors import EngineUnavailable
from services.tts.engines.base import AudioF32, SpeechRequest
from services.tts.engines.chatterbox_backend import Sampling, sampling_of
from services.tts.settings import S3GEN_LOOKAHEAD_TOKENS, TOKEN_MS, ChatterboxSettings

log = logging.getLogger(__name__)

SPEECH_VOCAB: Final = 6561
"""The S3 tokenizer's codebook; larger ids are special tokens and are never rendered."""
STATIC_CACHE_TOKENS: Final = 2048
"""Length of a pooled static KV cache (prompt + speech); longer requests run eagerly."""
WARM_UP_TEXT: Final = "Warming up the model."
WARM_UP_TOKENS: Final = 60
"""At most this many T3 steps at warm-up, sampled as a request with the settings' style is
(so the compiled path warmed is the one those requests take: one row, or two with CFG)."""


def load_torch_backend(
    folder: Path | None, device: str, settings: ChatterboxSettings
) -> TorchBackend:
    """`ChatterboxTTS.from_local` (or `from_pretrained`), wrapped and warmed up."""
    try:
        from chatterbox.tts import ChatterboxTTS
    except ImportError as exc:
        raise EngineUnavailable(
            f"chatterbox-tts is not importable ({exc}): install the TTS GPU environment"
            " (make install-gpu) and run the TTS service from .venv-tts"
        ) from exc
    model = (
        ChatterboxTTS.from_pretrained(device)
        if folder is None
        else ChatterboxTTS.from_local(folder, device)
    )
    backend = TorchBackend(model, settings, device)
    try:
        backend.warm_up()
        return backend
    except Exception as exc:  # the compiler's failures are of any type
        if settings.compile_mode == "off":
            raise
        failure = f"{type(exc).__name__}: {exc}"
    # out of the handler, so the traceback no longer holds the compiled backend's caches
    del backend
    release_compiled()
    log.warning(
        "chatterbox: T3's compiled step (compile_mode=%s) failed at warm-up (%s); serving it"
        " eager, which is slower (docs/engines.md)",
        settings.compile_mode,
        failure,
    )
    eager = TorchBackend(model, settings.model_copy(update={"compile_mode": "off"}), device)
    eager.warm_up()
    return eager


def release_compiled() -> None:
    """Drop what a failed compilation left: dynamo's caches, and the CUDA memory its graphs
    and static caches held."""
    import torch

    torch._dynamo.reset()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def pick_dtype(torch: Any, wanted: str, device: str) -> Any:
    """The torch dtype of T3: bfloat16 for `auto` on a GPU that supports it, else float32."""
    if wanted != "auto":
        return getattr(torch, wanted)
    if device.startswith("cuda") and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def let_dynamo_name_torch(torch: Any) -> None:
    """Give transformers' output-capturing module the global `torch` it lacks.

    The code torch 2.6's dynamo makes for transformers 5's `capture_outputs` wrapper
    (around `LlamaModel.forward`) looks `torch` up in that module's globals, which import
    it only for type checking: every compiled step failed with "NameError: name 'torch'
    is not defined". With the name there, compiled steps sample the same tokens as eager."""
    module = sys.modules.get("transformers.utils.output_capturing")
    if module is not None and not hasattr(module, "torch"):
        setattr(module, "torch", torch)  # noqa: B010 (a module attribute mypy cannot see)


def aligned(conds: Any) -> Any:
    """`conds` whose S3Gen prompt has exactly 2 mel frames per prompt token.

    Upstream's `embed_ref` lets the reference mel run one frame longer than twice its
    tokens; S3Gen then counts that frame as prompt and every rendering comes out half a
    token short and late. Cut to whole tokens, a rendering of n tokens is n * 40 ms."""
    gen = conds.gen
    tokens = min(int(gen["prompt_token"].size(1)), int(gen["prompt_feat"].size(1)) // 2)
    if gen["prompt_feat"].size(1) == 2 * tokens and gen["prompt_token"].size(1) == tokens:
        return conds
    trimmed = {
        **gen,
        "prompt_token": gen["prompt_token"][:, :tokens],
        "prompt_token_len": gen["prompt_token_len"].clamp(max=tokens),
        "prompt_feat": gen["prompt_feat"][:, : 2 * tokens],
    }
    return type(conds)(conds.t3, trimmed)


class TorchBackend:
    """A loaded `ChatterboxTTS`, driven step by step (see `chatterbox.SpeechBackend`)."""

    def __init__(self, model: Any, settings: ChatterboxSettings, device: str) -> None:
        import torch
        from chatterbox.models.t3.modules.cond_enc import T3Cond
        from chatterbox.tts import punc_norm

        self._torch = torch
        self._T3Cond = T3Cond
        self._punc_norm = punc_norm
        self._lp = importlib.import_module("transformers.generation.logits_process")
        self._model = model
        self._settings = settings
        self._t3 = model.t3
        self.device = device
        self.dtype = pick_dtype(torch, settings.dtype, device)
        self._t3.to(dtype=self.dtype)
        self.sample_rate = int(model.sr)
        self._per_token = self.sample_rate * TOKEN_MS // 1000
        self.builtin_conds = None if model.conds is None else aligned(model.conds)
        self._decode: Any = self._t3.tfmr
        self._pool: dict[int, list[Any]] = {1: [], 2: []}
        self._pool_lock = threading.Lock()
        self._compiled = settings.compile_mode != "off"
        if self._compiled:
            let_dynamo_name_torch(torch)
            self._decode = torch.compile(self._t3.tfmr, mode=settings.compile_mode, dynamic=False)
        log.info(
            "chatterbox on %s: T3 in %s, compile=%s", device, self.dtype, settings.compile_mode
        )

    def warm_up(self) -> None:
        """Run one short utterance (CUDA init, kernel choice, compilation) before serving."""
        if self.builtin_conds is None:
            log.warning("no built-in voice (conds.pt): chatterbox warm-up skipped")
            return
        request = SpeechRequest(text=WARM_UP_TEXT, voice="default")
        sampling = replace(sampling_of(self._settings, request), max_new_tokens=WARM_UP_TOKENS)
        tokens = list(self.tokens(self.builtin_conds, request.text, sampling))
        if tokens:
            self.render(self.builtin_conds, tokens, final=True)

    def prepare(self, clip: Path, exaggeration: float) -> Any:
        """Upstream's `prepare_conditionals`, leaving the model's shared `conds` as it was."""
        previous = self._model.conds
        try:
            self._model.prepare_conditionals(str(clip), exaggeration=exaggeration)
            return aligned(self._model.conds)
        finally:
            self._model.conds = previous

    def render(self, conds: Any, tokens: Sequence[int], final: bool) -> AudioF32:
        """S3Gen audio of `tokens`, as upstream's `S3Token2Wav.inference` renders it (flow
        matching, HiFT, the fade-in); unless `final`, without the last 3 tokens' audio.

        Every rendering is finalized: chatterbox-tts 0.1.7's `finalize=False` fails (its
        flow trims the encoder output but not the mask: "expanded size ... must match").
        A non-final segment's last tokens are rendered as an end and their audio dropped:
        the next segment renders them again, with what follows them."""
        torch = self._torch
        s3gen = self._model.s3gen
        with torch.inference_mode():
            speech = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)
            mels = s3gen.flow_inference(speech, ref_dict=conds.gen, finalize=True)
            wav, _ = s3gen.hift_inference(mels.to(dtype=s3gen.dtype), None)
            fade = s3gen.trim_fade[: wav.size(1)]
            wav[:, : fade.numel()] *= fade
            if not final:
                wav = wav[:, : max(0, wav.size(1) - S3GEN_LOOKAHEAD_TOKENS * self._per_token)]
            audio = wav.squeeze(0).float().cpu().numpy()
        if self._settings.watermark and audio.size:
            audio = self._model.watermarker.apply_watermark(audio, sample_rate=self.sample_rate)
        return np.asarray(audio, dtype=np.float32).reshape(-1)

    def tokens(self, conds: Any, text: str, sampling: Sampling) -> Iterator[int]:
        """One T3 step per `next()`: the forward pass for the last token, then sampling."""
        torch = self._torch
        hp = self._t3.hp
        with torch.inference_mode():
            embeds = self._prompt(conds, text, sampling)
            rows = embeds.size(0)
            cache = self._take_cache(rows, embeds.size(1) + sampling.max_new_tokens + 1)
        static = cache is not None
        try:
            with torch.inference_mode():
                hidden, past = self._forward(embeds, cache, 0, static, prefill=True)
                processors = self._processors(sampling)
                generated = torch.full((1, 1), hp.start_speech_token, device=self.device)
            position = embeds.size(1)
            for step in range(sampling.max_new_tokens):
                with torch.inference_mode():
                    if step:
                        embed = self._t3.speech_emb(generated[:, -1:])
                        embed = embed + self._t3.speech_pos_emb.get_fixed_embedding(step)
                        step_embeds = embed.expand(rows, -1, -1)
                        hidden, past = self._forward(step_embeds, past, position, static)
                        position += 1
                    token = self._sample(hidden, generated, processors, sampling.cfg_weight)
                    generated = torch.cat([generated, token], dim=1)
                value = int(token.item())
                if value == hp.stop_speech_token:
                    return
                if value < SPEECH_VOCAB:
                    yield value
        finally:
            self._give_back(rows, cache)

    def _prompt(self, conds: Any, text: str, sampling: Sampling) -> Any:
        """Conditioning, text and start-of-speech embeddings: (1 or 2, length, dim)."""
        torch = self._torch
        functional = torch.nn.functional
        hp = self._t3.hp
        text_tokens = self._model.tokenizer.text_to_tokens(self._punc_norm(text)).to(self.device)
        if sampling.cfg_weight > 0:
            text_tokens = torch.cat([text_tokens, text_tokens], dim=0)
        text_tokens = functional.pad(text_tokens, (1, 0), value=hp.start_text_token)
        text_tokens = functional.pad(text_tokens, (0, 1), value=hp.stop_text_token)
        cond = self._T3Cond(
            speaker_emb=conds.t3.speaker_emb,
            cond_prompt_speech_tokens=conds.t3.cond_prompt_speech_tokens,
            emotion_adv=sampling.exaggeration * torch.ones(1, 1, 1),
        ).to(device=self.device, dtype=self.dtype)
        bos = torch.full((1, 1), hp.start_speech_token, dtype=torch.long, device=self.device)
        embeds, _ = self._t3.prepare_input_embeds(
            t3_cond=cond,
            text_tokens=text_tokens,
            speech_tokens=bos.expand(text_tokens.size(0), 1),
            cfg_weight=sampling.cfg_weight,
        )
        start = self._t3.speech_emb(bos) + self._t3.speech_pos_emb.get_fixed_embedding(0)
        return torch.cat([embeds, start.expand(embeds.size(0), -1, -1)], dim=1)

    def _forward(
        self, embeds: Any, past: Any, position: int, static: bool, prefill: bool = False
    ) -> Any:
        """One transformer pass: the last position's hidden state and the cache.

        With a static cache, positions are explicit and the one-token decode step runs
        compiled; the prompt (whose length varies) always runs eagerly."""
        torch = self._torch
        kwargs: dict[str, Any] = {"inputs_embeds": embeds, "past_key_values": past}
        if static:
            length = embeds.size(1)
            kwargs["cache_position"] = torch.arange(position, position + length, device=self.device)
        model = self._decode if static and not prefill else self._t3.tfmr
        out = model(use_cache=True, **kwargs)
        return out.last_hidden_state[:, -1, :], out.past_key_values

    def _sample(self, hidden: Any, generated: Any, processors: list[Any], cfg: float) -> Any:
        torch = self._torch
        logits = self._t3.speech_head(hidden).float()
        if logits.size(0) == 2:
            logits = logits[0:1] + cfg * (logits[0:1] - logits[1:2])
        for processor in processors:
            logits = processor(generated, logits)
        return torch.multinomial(torch.softmax(logits, dim=-1), num_samples=1)

    def _processors(self, sampling: Sampling) -> list[Any]:
        lp = self._lp
        found: list[Any] = [lp.RepetitionPenaltyLogitsProcessor(float(sampling.repetition_penalty))]
        found.append(lp.TemperatureLogitsWarper(float(sampling.temperature)))
        min_p = getattr(lp, "MinPLogitsWarper", None) or getattr(lp, "MinPLogitsProcessor", None)
        if min_p is not None and sampling.min_p > 0:
            found.append(min_p(min_p=float(sampling.min_p)))
        if sampling.top_p < 1.0:
            found.append(lp.TopPLogitsWarper(top_p=float(sampling.top_p)))
        return found

    def _take_cache(self, rows: int, needed: int) -> Any:
        """A pooled static KV cache when compiling and the request fits; None: dynamic."""
        if not self._compiled or needed > STATIC_CACHE_TOKENS:
            return None
        with self._pool_lock:
            if self._pool[rows]:
                cache = self._pool[rows].pop()
                cache.reset()
                return cache
        static_cache = importlib.import_module("transformers").StaticCache
        try:
            return static_cache(
                config=self._t3.cfg,
                max_batch_size=rows,
                max_cache_len=STATIC_CACHE_TOKENS,
                device=self.device,
                dtype=self.dtype,
            )
        except TypeError:  # newer transformers infer batch, device and dtype on first use
            return static_cache(config=self._t3.cfg, max_cache_len=STATIC_CACHE_TOKENS)

    def _give_back(self, rows: int, cache: Any) -> None:
        if cache is not None:
            with self._pool_lock:
                self._pool[rows].append(cache)
