"""Streaming TTS through the Synthesizer: time to first audio and real-time factor.

    python -m benchmarks.tts_stream --engine piper --concurrency 1,2,4 \\
        --out benchmarks/results/tts_stream_piper_cpu.json
    python -m benchmarks.tts_stream --engine espeak \\
        --out benchmarks/results/tts_stream_espeak_cpu.json
    python -m benchmarks.tts_stream --engine chatterbox --model models/chatterbox
    python -m benchmarks.tts_stream --engine chatterbox --random-weights --tokens 125 \\
        --out benchmarks/results/tts_stream_chatterbox_random_gpu.json

At each concurrency C, C streams each synthesize `--rounds` sentences back to back
through one Synthesizer (max_concurrent = C unless `--max-concurrent`), as the TTS
service does. Per synthesis: time to first audio (the Synthesizer's first chunk) and
real-time factor (wall time / seconds of audio; below 1 is faster than real time).
`--random-weights` builds a chatterbox of real size with random weights from
chatterbox's own classes (T3 0.5B Llama, S3Gen, voice encoder) and a character
tokenizer: needs torch + chatterbox-tts (.venv-tts) and, to mean anything, a GPU.
Random T3 weights rarely sample the end-of-speech token, so every request runs to
`--tokens` speech tokens (25 per second of audio).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from contextlib import aclosing
from pathlib import Path
from typing import Any

from services.common.stats import percentile
from services.loadtest.report import versions, write
from services.tts.engines.base import SpeechRequest, TtsEngine
from services.tts.settings import ChatterboxSettings, EspeakSettings
from services.tts.synthesizer import Synthesizer

SENTENCES = [
    "The quick brown fox jumps over the lazy dog near the quiet river bank.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "A voice agent answers in short sentences, so the first audio matters most.",
    "Streaming speech starts playing long before the whole sentence is ready.",
]


async def one(synthesizer: Synthesizer, request: SpeechRequest, rate: int) -> dict[str, float]:
    started = time.perf_counter()
    first: float | None = None
    samples = 0
    async with aclosing(synthesizer.stream(request, rate)) as chunks:
        async for chunk in chunks:
            if first is None:
                first = time.perf_counter() - started
            samples += chunk.size
    wall = time.perf_counter() - started
    audio = samples / rate
    return {"ttfa": first if first is not None else wall, "wall": wall, "audio": audio}


async def run_level(
    engine: TtsEngine, voice: str, concurrency: int, args: argparse.Namespace
) -> dict[str, Any]:
    slots = args.max_concurrent or concurrency
    synthesizer = Synthesizer(engine, slots, max_queue=10_000, chunk_ms=args.chunk_ms)
    results: list[dict[str, float]] = []

    async def stream(index: int) -> None:
        for round_ in range(args.rounds):
            text = SENTENCES[(index + round_) % len(SENTENCES)]
            request = SpeechRequest(text=text, voice=voice)
            results.append(await one(synthesizer, request, args.sample_rate))

    began = time.perf_counter()
    await asyncio.gather(*(stream(i) for i in range(concurrency)))
    elapsed = time.perf_counter() - began
    ttfa = [r["ttfa"] for r in results]
    rtf = [r["wall"] / r["audio"] for r in results if r["audio"] > 0]
    audio = sum(r["audio"] for r in results)
    return {
        "concurrency": concurrency,
        "max_concurrent": slots,
        "syntheses": len(results),
        "audio_s": round(audio, 2),
        "seconds": round(elapsed, 3),
        "ttfa_p50_ms": round(1000 * percentile(ttfa, 50), 1),
        "ttfa_p95_ms": round(1000 * percentile(ttfa, 95), 1),
        "rtf_p50": round(percentile(rtf, 50), 4),
        "rtf_p95": round(percentile(rtf, 95), 4),
        "rtf_mean": round(statistics.fmean(rtf), 4),
        "audio_s_per_s": round(audio / elapsed, 2),
    }


def espeak_engine(args: argparse.Namespace) -> tuple[TtsEngine, str, dict[str, Any]]:
    from services.tts.engines.espeak import EspeakEngine

    engine = EspeakEngine(EspeakSettings(), chunk_ms=args.chunk_ms)
    engine.load()
    return engine, engine.default_voice, {"engine_model": engine.model}


def piper_engine(args: argparse.Namespace) -> tuple[TtsEngine, str, dict[str, Any]]:
    from services.tts.engines.piper import PiperEngine
    from services.tts.settings import PiperSettings

    engine = PiperEngine(PiperSettings())
    engine.load()
    return engine, engine.default_voice, {"engine_model": engine.model}


def chatterbox_engine(
    args: argparse.Namespace, workdir: Path
) -> tuple[TtsEngine, str, dict[str, Any]]:
    from services.tts.engines.chatterbox import ChatterboxEngine, load_backend
    from services.tts.engines.chatterbox_torch import TorchBackend

    overrides: dict[str, Any] = {
        "device": args.device,
        "dtype": args.dtype,
        "compile_mode": args.compile_mode,
        "max_new_tokens": args.tokens,
    }
    for name in ("first_chunk_tokens", "chunk_tokens"):
        if getattr(args, name) is not None:
            overrides[name] = getattr(args, name)
    if args.random_weights:
        settings = ChatterboxSettings(models_dir=workdir / "none", allow_download=True, **overrides)

        def factory(folder: Path | None, device: str, chosen: ChatterboxSettings) -> Any:
            backend = TorchBackend(random_chatterbox(device, workdir), chosen, device)
            backend.warm_up()
            return backend

        engine = ChatterboxEngine(settings, backend_factory=factory)
        described = "chatterbox, random weights of real size (chatterbox's own classes)"
    else:
        settings = ChatterboxSettings(model=args.model or "chatterbox", **overrides)
        engine = ChatterboxEngine(settings, backend_factory=load_backend)
        described = f"chatterbox from {args.model or 'models/chatterbox'}"
    engine.load()
    return (
        engine,
        engine.default_voice,
        {"engine_model": described, **settings.model_dump(mode="json")},
    )


def random_chatterbox(device: str, workdir: Path) -> Any:
    """A `ChatterboxTTS` of real size with random weights and a built-in random voice."""
    import torch
    from chatterbox.models.s3gen import S3Gen
    from chatterbox.models.t3 import T3
    from chatterbox.models.t3.modules.cond_enc import T3Cond
    from chatterbox.models.tokenizers import EnTokenizer
    from chatterbox.models.voice_encoder import VoiceEncoder
    from chatterbox.tts import ChatterboxTTS, Conditionals

    from benchmarks.chatterbox_random import character_tokenizer

    torch.manual_seed(0)
    t3 = T3().to(device).eval()
    s3gen = S3Gen().to(device).eval()
    voice_encoder = VoiceEncoder().to(device).eval()
    path = character_tokenizer(workdir / "tokenizer.json", t3.hp.text_tokens_dict_size)
    tokenizer = EnTokenizer(str(path))
    prompt = t3.hp.speech_cond_prompt_len
    t3_cond = T3Cond(
        speaker_emb=torch.randn(1, t3.hp.speaker_embed_size),
        cond_prompt_speech_tokens=torch.randint(0, 6561, (1, prompt)),
        emotion_adv=0.5 * torch.ones(1, 1, 1),
    )
    reference = {
        "prompt_token": torch.randint(0, 6561, (1, 150)),
        "prompt_token_len": torch.tensor([150]),
        "prompt_feat": torch.randn(1, 300, 80),
        "prompt_feat_len": None,
        "embedding": torch.randn(1, 192),
    }
    conds = Conditionals(t3_cond, reference).to(device)
    return ChatterboxTTS(t3, s3gen, voice_encoder, tokenizer, device, conds=conds)


async def measure(engine: TtsEngine, voice: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    await run_level(engine, voice, 1, argparse.Namespace(**{**vars(args), "rounds": 1}))
    rows = []
    for concurrency in args.concurrency:
        row = await run_level(engine, voice, concurrency, args)
        print(
            f"C={concurrency:3} first audio p50 {row['ttfa_p50_ms']:8.1f} ms "
            f"p95 {row['ttfa_p95_ms']:8.1f} ms   RTF p50 {row['rtf_p50']:.4f} "
            f"p95 {row['rtf_p95']:.4f}   {row['audio_s_per_s']:.1f} s of audio per s",
            flush=True,
        )
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", choices=("espeak", "piper", "chatterbox"), default="piper")
    parser.add_argument(
        "--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 16]
    )
    parser.add_argument("--rounds", type=int, default=4, help="sentences per stream and level")
    parser.add_argument("--max-concurrent", type=int, default=0, help="Synthesizer slots (0: C)")
    parser.add_argument("--chunk-ms", type=int, default=200)
    parser.add_argument("--sample-rate", type=int, default=24000)
    parser.add_argument("--model", help="chatterbox: model folder (default models/chatterbox)")
    parser.add_argument("--random-weights", action="store_true", help="chatterbox: random weights")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="cuda")
    parser.add_argument(
        "--dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto"
    )
    parser.add_argument(
        "--compile-mode",
        choices=("off", "default", "reduce-overhead", "max-autotune"),
        default="off",
    )
    parser.add_argument("--tokens", type=int, default=1000, help="chatterbox: max speech tokens")
    parser.add_argument(
        "--first-chunk-tokens", type=int, help="chatterbox: tokens in the first piece"
    )
    parser.add_argument("--chunk-tokens", type=int, help="chatterbox: tokens per later piece")
    parser.add_argument("--out", type=Path, help="where to write the JSON results")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tts-bench-") as workdir:
        if args.engine == "espeak":
            engine, voice, described = espeak_engine(args)
        elif args.engine == "piper":
            engine, voice, described = piper_engine(args)
        else:
            engine, voice, described = chatterbox_engine(args, Path(workdir))
        rows = asyncio.run(measure(engine, voice, args))
    body = {
        "benchmark": "tts_stream",
        "engine": engine.name,
        "device": engine.device,
        "settings": {
            **described,
            "chunk_ms": args.chunk_ms,
            "sample_rate": args.sample_rate,
            "rounds": args.rounds,
        },
        "versions": versions(
            "espeakng-loader",
            "piper-tts",
            "onnxruntime",
            "numpy",
            "soxr",
            "torch",
            "chatterbox-tts",
        ),
        "results": rows,
    }
    if args.out:
        write(args.out, body)


if __name__ == "__main__":
    main()
