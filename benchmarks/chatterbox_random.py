"""A chatterbox model folder with random weights, made offline from chatterbox-tts's classes.

`build(folder)` writes what `ChatterboxTTS.from_local` reads, at the real sizes (T3: the
0.5B Llama; S3Gen: flow matching + HiFT; the voice encoder), so the project's own
loading path (`chatterbox.load_backend` → `from_local`) runs as it does on a pulled model:

    ve.safetensors  t3_cfg.safetensors  s3gen.safetensors   random weights (seeded)
    tokenizer.json   a character tokenizer with chatterbox's special tokens
    conds.pt         the built-in voice: upstream's `prepare_conditionals` on an espeak clip

Needs torch and chatterbox-tts (the TTS environment); nothing is downloaded.
"""

from __future__ import annotations

import importlib
import string
import time
from pathlib import Path
from typing import Any

from services.client.stream import write_wav
from services.tts.engines.chatterbox import REQUIRED_FILES
from tests.speech import speak, to_pcm16

CLIP_RATE = 24000
"""chatterbox's own rate: reference clips are written at it."""
STOP_TEXT_ID = 0
START_TEXT_ID = 255
"""T3's `stop_text_token` and `start_text_token`: the tokenizer gives them the same ids."""
SPECIALS = ("[STOP]", "[UNK]", "[SPACE]", "[PAD]", "[SEP]", "[CLS]", "[MASK]")
DEFAULT_VOICE_TEXT = (
    "This is the built in voice of a chatterbox model with random weights, made offline."
)


def write_clip(path: Path, text: str, voice: str = "en-us+klatt2") -> Path:
    """`text` spoken by espeak-ng, as a 24 kHz wav file (a reference clip)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_wav(path, to_pcm16(speak(text, CLIP_RATE, voice=voice)), CLIP_RATE)
    return path


def character_tokenizer(path: Path, vocab_size: int) -> Path:
    """A character-level tokenizer.json: `[STOP]`=0, `[START]`=255, ids below `vocab_size`."""
    from tokenizers import Tokenizer, models

    characters = sorted(set(string.ascii_letters + string.digits + string.punctuation))
    names = [*SPECIALS, *characters]
    if len(names) >= START_TEXT_ID or vocab_size <= START_TEXT_ID:
        raise ValueError(f"a character tokenizer does not fit {vocab_size} text ids")
    unused = [f"[UNUSED{index}]" for index in range(len(names), START_TEXT_ID)]
    vocab = {name: index for index, name in enumerate([*names, *unused, "[START]"])}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="[UNK]"))
    tokenizer.add_special_tokens([*SPECIALS, "[START]"])
    tokenizer.save(str(path))
    return path


def build(folder: Path, seed: int = 0) -> dict[str, Any]:
    """Write a complete random chatterbox into `folder`; what it built and how long it took."""
    import torch
    from chatterbox.models.s3gen import S3Gen
    from chatterbox.models.t3 import T3
    from chatterbox.models.tokenizers import EnTokenizer
    from chatterbox.models.voice_encoder import VoiceEncoder
    from chatterbox.tts import ChatterboxTTS

    save_file = importlib.import_module("safetensors.torch").save_file
    started = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    t3, s3gen, encoder = T3().eval(), S3Gen().eval(), VoiceEncoder().eval()
    parameters = {}
    for name, module in (("ve", encoder), ("t3_cfg", t3), ("s3gen", s3gen)):
        state = {key: value.contiguous() for key, value in module.state_dict().items()}
        save_file(state, str(folder / f"{name}.safetensors"))
        parameters[name] = sum(p.numel() for p in module.parameters())
    tokenizer = EnTokenizer(
        str(character_tokenizer(folder / "tokenizer.json", t3.hp.text_tokens_dict_size))
    )
    model = ChatterboxTTS(t3, s3gen, encoder, tokenizer, "cpu")
    clip = write_clip(folder / "default_voice.wav", DEFAULT_VOICE_TEXT)
    model.prepare_conditionals(str(clip))
    model.conds.save(folder / "conds.pt")
    missing = [name for name in (*REQUIRED_FILES, "conds.pt") if not (folder / name).is_file()]
    if missing:
        raise RuntimeError(f"random chatterbox in {folder} lacks {missing}")
    return {
        "seed": seed,
        "parameters": parameters,
        "build_s": round(time.perf_counter() - started, 1),
        "files_mb": {p.name: round(p.stat().st_size / 2**20, 1) for p in sorted(folder.iterdir())},
    }


def is_built(folder: Path) -> bool:
    """Whether `folder` already holds a complete model (reused instead of rebuilt)."""
    return all((folder / name).is_file() for name in (*REQUIRED_FILES, "conds.pt"))
