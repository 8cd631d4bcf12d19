"""Building Mimi and the Moshi LM: from a pulled checkpoint, or small with random weights.

Both paths use the `moshi` package's own classes (`MimiModel`, `LMModel`, its loaders), so
what the service steps is the code a real checkpoint runs; only the sizes and the weights
differ. Imported only by the `moshi` and `moshi-random` engines (torch lives in its own
environment: `make install-duplex`).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import sentencepiece
import torch
from moshi.models import loaders
from moshi.models.compression import MimiModel
from moshi.models.lm import LMModel
from moshi.modules import SEANetDecoder, SEANetEncoder, transformer
from moshi.quantization import SplitResidualVectorQuantizer

from services.common.errors import EngineUnavailable
from services.duplex.settings import RandomMoshiSettings

MIMI_FILE: Final = loaders.MIMI_NAME
LM_FILE: Final = loaders.MOSHI_NAME
TOKENIZER_FILE: Final = loaders.TEXT_TOKENIZER_NAME
CONFIG_FILE: Final = "config.json"
REQUIRED_FILES: Final = (LM_FILE, MIMI_FILE, TOKENIZER_FILE)
CORPUS: Final = (
    "hello there how are you doing today",
    "the weather is nice in paris this morning",
    "i would like a cup of coffee please",
    "what time is it now and where are we going",
    "thank you very much for your help with this",
)
"""Sentences the random model's text tokenizer is trained on (it only needs real pieces)."""


@dataclass
class MoshiModels:
    """What one engine steps: the codec, the LM, the text tokenizer."""

    mimi: MimiModel
    lm: LMModel
    tokenizer: sentencepiece.SentencePieceProcessor
    model_type: str = "moshi"
    lm_gen_config: dict[str, Any] | None = None


def load_checkpoint(folder: Path, device: str, dtype: torch.dtype) -> MoshiModels:
    """A pulled Moshi folder, read without the network (`config.json` when it has one,
    else the Moshi 7B configuration the package knows)."""
    missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
    if missing:
        raise EngineUnavailable(f"incomplete Moshi model at {folder}: no {', '.join(missing)}")
    config = folder / CONFIG_FILE
    raw = json.loads(config.read_text()) if config.is_file() else None
    _refuse_unsupported(raw, folder)
    info = _checkpoint_info(folder, raw)
    mimi = info.get_mimi(device=device)
    lm = info.get_moshi(device=device, dtype=dtype)
    return MoshiModels(
        mimi.eval(), lm.eval(), info.get_text_tokenizer(), info.model_type, info.lm_gen_config
    )


def _checkpoint_info(folder: Path, raw: dict[str, Any] | None) -> loaders.CheckpointInfo:
    if raw is None:
        return loaders.CheckpointInfo(folder / LM_FILE, folder / MIMI_FILE, folder / TOKENIZER_FILE)
    return loaders.CheckpointInfo.from_hf_repo(
        "local",
        moshi_weights=folder / raw.get("moshi_name", LM_FILE),
        mimi_weights=folder / raw.get("mimi_name", MIMI_FILE),
        tokenizer=folder / raw.get("tokenizer_name", TOKENIZER_FILE),
        config_path=folder / CONFIG_FILE,
    )


def _refuse_unsupported(raw: dict[str, Any] | None, folder: Path) -> None:
    """Checkpoints this engine cannot step correctly fail here, saying why."""
    if raw is None:
        return
    kind = raw.get("model_type", "moshi")
    if kind != "moshi":
        raise EngineUnavailable(
            f"{folder} holds a {kind!r} checkpoint; the duplex service runs Moshi "
            "speech-to-speech models (model_type 'moshi')"
        )
    if raw.get("lora_name") or raw.get("mimi_config_name"):
        raise EngineUnavailable(
            f"{folder}: LoRA and custom-Mimi checkpoints are not supported yet (config.json "
            "names lora_name or mimi_config_name)"
        )


def build_random(settings: RandomMoshiSettings, device: str) -> MoshiModels:
    """Mimi and the Moshi LM at a small size, random weights from `settings.seed`: Moshi's
    structure (24 kHz, 80 ms frames, delayed codebooks, a depth transformer per step)."""
    torch.manual_seed(settings.seed)
    tokenizer = train_tokenizer(settings.text_vocab)
    mimi = _random_mimi(settings).to(device).eval()
    k = settings.codebooks
    lm = LMModel(
        delays=[0, 0, *[1] * (k - 1), 0, *[1] * (k - 1)],
        n_q=2 * k,
        dep_q=k,
        card=settings.card,
        text_card=tokenizer.vocab_size(),
        existing_text_padding_id=3,
        dim=settings.dim,
        num_heads=settings.heads,
        num_layers=settings.layers,
        hidden_scale=2,
        causal=True,
        context=settings.context,
        max_period=10_000,
        gating="silu",
        norm="rms_norm_f32",
        positional_embedding="rope",
        depformer_dim=settings.dim,
        depformer_dim_feedforward=2 * settings.dim,
        depformer_num_heads=settings.heads,
        depformer_num_layers=1,
        depformer_multi_linear=True,
        depformer_context=k,
        depformer_pos_emb="none",
        depformer_weights_per_step=True,
        depformer_gating="silu",
        device=device,
    ).eval()
    return MoshiModels(mimi, lm, tokenizer)


def _random_mimi(settings: RandomMoshiSettings) -> MimiModel:
    dim = settings.mimi_dim
    seanet = {
        "channels": 1,
        "dimension": dim,
        "causal": True,
        "n_filters": settings.mimi_filters,
        "n_residual_layers": 1,
        "activation": "ELU",
        "compress": 2,
        "dilation_base": 2,
        "disable_norm_outer_blocks": 0,
        "kernel_size": 7,
        "residual_kernel_size": 3,
        "last_kernel_size": 3,
        "norm": "none",
        "pad_mode": "constant",
        "ratios": [8, 6, 5, 4],
        "true_skip": True,
    }
    encoder, decoder = SEANetEncoder(**seanet), SEANetDecoder(**seanet)

    def projected() -> transformer.ProjectedTransformer:
        return transformer.ProjectedTransformer(
            d_model=dim,
            num_heads=2,
            num_layers=1,
            causal=True,
            layer_scale=0.01,
            context=25,
            conv_layout=True,
            max_period=10_000,
            gating="none",
            norm="layer_norm",
            positional_embedding="rope",
            dim_feedforward=2 * dim,
            input_dimension=dim,
            output_dimensions=[dim],
        )

    quantizer = SplitResidualVectorQuantizer(
        dimension=max(8, dim // 2),
        n_q=settings.codebooks,
        bins=settings.card,
        input_dimension=dim,
        output_dimension=dim,
    )
    mimi = MimiModel(
        encoder,
        decoder,
        quantizer,
        channels=1,
        sample_rate=loaders.SAMPLE_RATE,
        frame_rate=loaders.FRAME_RATE,
        encoder_frame_rate=loaders.SAMPLE_RATE / encoder.hop_length,
        causal=True,
        resample_method="conv",
        encoder_transformer=projected(),
        decoder_transformer=projected(),
    )
    mimi.set_num_codebooks(settings.codebooks)
    return mimi


def train_tokenizer(vocab: int) -> sentencepiece.SentencePieceProcessor:
    """A SentencePiece model trained in memory on CORPUS (ids 0-3 as Moshi's tokenizer
    uses them: 3 is padding, never said)."""
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 4),
        model_writer=model,
        vocab_size=vocab,
        model_type="unigram",
        unk_id=1,
        bos_id=-1,
        eos_id=2,
        pad_id=3,
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
    )
    return sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
