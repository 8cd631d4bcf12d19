"""A tiny random-weight Whisper in CTranslate2 format, built offline for tests.

No torch and no download: the weights come from a seeded numpy generator and
the tokenizer is a byte-level BPE whose ids follow Whisper's multilingual
layout, so faster-whisper loads the folder as it would a real model and never
reaches for the Hub. The output bias favours `<|endoftext|>`, so greedy
decoding stops after a few tokens. Transcripts are gibberish, but they are
deterministic.
"""

from __future__ import annotations

import json
import math
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Final
from unittest import mock

import numpy as np
import numpy.typing as npt
from ctranslate2.specs import transformer_spec, whisper_spec
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

_LANGUAGE_TABLE: Final = """
en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu ta
no th ur hr bg lt la mi ml cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk
sq sw gl mr pa si km sn yo so af oc ka be tg sd gu am yi lo uz fo ht ps tk nn mt sa lb
my bo tl mg as tt haw ln ha ba jw su
"""
LANGUAGES: Final = tuple(_LANGUAGE_TABLE.split())
"""Whisper's 99 language codes, in token order (large-v3 adds a 100th, `yue`)."""

EOT: Final = 50257
VOCAB_SIZE: Final = 51865
N_MELS: Final = 80
D_MODEL: Final = 32
N_HEADS: Final = 2
FFN: Final = 64
N_AUDIO_CTX: Final = 1500
N_TEXT_CTX: Final = 448
EOT_BIAS: Final = 16.0
"""Added to the `<|endoftext|>` logit: large enough to end most decodes within a few tokens."""
CROSS_QUERY_SCALE: Final = 1.5
"""Sharp cross-attention, so the text (and detected language) depends on the audio."""

_TASK_TOKENS: Final = (
    "<|translate|>",
    "<|transcribe|>",
    "<|startoflm|>",
    "<|startofprev|>",
    "<|nocaptions|>",
    "<|notimestamps|>",
)

F32 = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Dims:
    """Model shape. The defaults are the tiny test model; `LARGE_V3_TURBO` is real size."""

    n_mels: int = N_MELS
    d_model: int = D_MODEL
    heads: int = N_HEADS
    ffn: int = FFN
    encoder_layers: int = 1
    decoder_layers: int = 1

    @property
    def scale(self) -> float:
        """Keeps activations in range as the width grows (1.0 at the tiny width)."""
        return math.sqrt(D_MODEL / self.d_model)


TINY: Final = Dims()
LARGE_V3_TURBO: Final = Dims(
    n_mels=128, d_model=1280, heads=20, ffn=5120, encoder_layers=32, decoder_layers=4
)
"""whisper-large-v3-turbo's shape (~800M parameters): for GPU benchmarks with random weights."""


def _byte_alphabet() -> list[str]:
    """GPT-2's byte-to-unicode table, in id order (so the space `Ġ` gets id 220)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    rest = [b for b in range(256) if b not in printable]
    chars = {b: chr(b) for b in printable}
    chars.update({b: chr(256 + i) for i, b in enumerate(rest)})
    return [chars[b] for b in [*printable, *rest]]


def whisper_tokens() -> list[str]:
    """All 51865 tokens, index = id: text, "", specials, languages, tasks, timestamps."""
    alphabet = _byte_alphabet()
    pairs = (first + second for first in alphabet for second in alphabet)
    text = [*alphabet, *islice(pairs, EOT - 1 - len(alphabet))]
    specials = ["<|endoftext|>", "<|startoftranscript|>"]
    specials += [f"<|{code}|>" for code in LANGUAGES]
    specials += list(_TASK_TOKENS)
    timestamps = [f"<|{i * 0.02:.2f}|>" for i in range(1501)]
    tokens = [*text, "", *specials, *timestamps]
    assert len(tokens) == VOCAB_SIZE, len(tokens)
    return tokens


def _tokenizer(tokens: list[str]) -> Tokenizer:
    vocab = {token: i for i, token in enumerate(tokens[:EOT])}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(tokens[EOT:])
    return tokenizer


class _Weights:
    """Seeded random tensors of the right shapes."""

    def __init__(self, seed: int, dims: Dims) -> None:
        self._rng = np.random.default_rng(seed)
        self.d = dims.d_model
        self.ffn_width = dims.ffn
        self.scale = dims.scale

    def normal(self, *shape: int, scale: float = 0.2) -> F32:
        return (self._rng.standard_normal(shape) * (scale * self.scale)).astype(np.float32)

    def linear(self, spec: Any, n_out: int, n_in: int, bias: bool = True) -> None:
        spec.weight = self.normal(n_out, n_in)
        if bias:
            spec.bias = self.normal(n_out, scale=0.02)

    def layer_norm(self, spec: Any) -> None:
        spec.gamma = np.ones(self.d, dtype=np.float32)
        spec.beta = np.zeros(self.d, dtype=np.float32)

    def ffn(self, spec: transformer_spec.FeedForwardSpec) -> None:
        self.layer_norm(spec.layer_norm)
        self.linear(spec.linear_0, self.ffn_width, self.d)
        self.linear(spec.linear_1, self.d, self.ffn_width)

    def attention(self, spec: Any, self_attention: bool) -> None:
        self.layer_norm(spec.layer_norm)
        linears = spec.linear
        if self_attention:
            self.linear(linears[0], 3 * self.d, self.d)
        else:
            linears[0].weight = self.normal(self.d, self.d, scale=CROSS_QUERY_SCALE)
            linears[0].bias = self.normal(self.d, scale=0.02)
            self.linear(linears[1], 2 * self.d, self.d)
        self.linear(linears[-1], self.d, self.d)


def _spec(tokens: list[str], seed: int, dims: Dims) -> whisper_spec.WhisperSpec:
    spec = whisper_spec.WhisperSpec(
        dims.encoder_layers, dims.heads, dims.decoder_layers, dims.heads
    )
    w = _Weights(seed, dims)
    d = dims.d_model
    enc = spec.encoder
    enc.conv1.weight = w.normal(d, dims.n_mels, 3)
    enc.conv1.bias = w.normal(d, scale=0.02)
    enc.conv2.weight = w.normal(d, d, 3)
    enc.conv2.bias = w.normal(d, scale=0.02)
    enc.position_encodings.encodings = w.normal(N_AUDIO_CTX, d)
    w.layer_norm(enc.layer_norm)
    for layer in enc.layer:
        w.attention(layer.self_attention, self_attention=True)
        w.ffn(layer.ffn)

    dec = spec.decoder
    embeddings = w.normal(VOCAB_SIZE, d, scale=0.5)
    dec.embeddings.weight = embeddings
    dec.position_encodings.encodings = w.normal(N_TEXT_CTX, d)
    w.layer_norm(dec.layer_norm)
    for layer in dec.layer:
        w.attention(layer.self_attention, self_attention=True)
        w.attention(layer.attention, self_attention=False)
        w.ffn(layer.ffn)
    dec.projection.weight = embeddings  # tied, as in Whisper: saved once
    bias = np.zeros(VOCAB_SIZE, dtype=np.float32)
    bias[EOT] = EOT_BIAS
    dec.projection.bias = bias

    spec.register_vocabulary(tokens)
    config = spec.config
    config.suppress_ids = []
    config.suppress_ids_begin = [220, EOT]
    config.lang_ids = list(range(EOT + 2, EOT + 2 + len(LANGUAGES)))
    config.alignment_heads = [(0, h) for h in range(N_HEADS)]
    return spec


def build_tiny_whisper(path: Path, seed: int = 0, dims: Dims = TINY) -> Path:
    """Write a random-weight multilingual Whisper (CTranslate2 + tokenizer.json) into `path`.

    Tiny by default; `dims=LARGE_V3_TURBO` builds one of real size (minutes, ~1.6 GB)."""
    path.mkdir(parents=True, exist_ok=True)
    tokens = whisper_tokens()
    spec = _spec(tokens, seed, dims)
    spec.validate()
    spec.optimize(quantization="float16")  # half the size; the tied weight is stored once
    spec.save(str(path))
    _tokenizer(tokens).save(str(path / "tokenizer.json"))
    preprocessor = {
        "feature_size": dims.n_mels,
        "sampling_rate": 16000,
        "hop_length": 160,
        "chunk_length": 30,
        "n_fft": 400,
    }
    (path / "preprocessor_config.json").write_text(json.dumps(preprocessor), encoding="utf-8")
    return path


def _refuse(*args: object, **kwargs: object) -> None:
    raise AssertionError(f"network access attempted: {args}")


@contextmanager
def offline() -> Iterator[None]:
    """Nothing may reach the network meanwhile: the Hub is off and sockets refuse."""
    with (
        mock.patch.dict(os.environ, {"HF_HUB_OFFLINE": "1"}),
        mock.patch.object(socket.socket, "connect", _refuse),
        mock.patch.object(socket.socket, "connect_ex", _refuse),
    ):
        yield
