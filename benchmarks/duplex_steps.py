"""Per-step time of the duplex engine against batch size, and Moshi's memory per session.

    .venv-duplex/bin/python -m benchmarks.duplex_steps --batches 1,2,3,4,5,6,8 \\
        --out benchmarks/results/duplex_steps_cpu.json

Runs the `moshi-random` engine (moshi's own Mimi and LM classes, random weights) at each
batch size with every slot active: one step = encode a frame for every slot, one LM step,
decode. What a CPU run shows is the shape of the curve (how a step's time grows with the
sessions in it), not a GPU's absolute numbers. `--config` picks the model size: `tiny`
(the tests' model) or `small` (wider, 8 codebooks of 2048 like the real Mimi).

It also builds the real Moshi 7B and Mimi configurations on PyTorch's `meta` device (no
memory, no weights) and counts, from the package's own streaming state, the bytes one
session holds (KV caches, codec buffers) and the weights' bytes: our per-session figure
for the capacity plan (`voice-agent plan`), computed, not measured on a GPU.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from services.common.stats import percentile
from services.duplex.engines.base import StepInput
from services.duplex.engines.moshi import random_engine, state_bytes
from services.duplex.settings import DuplexSection, MoshiSettings, RandomMoshiSettings
from services.loadtest.report import versions, write

CONFIGS = {
    "tiny": RandomMoshiSettings(),
    "small": RandomMoshiSettings(
        codebooks=8,
        card=2048,
        dim=256,
        layers=4,
        heads=4,
        context=250,
        mimi_dim=64,
        mimi_filters=8,
    ),
}
FRAME_S = 0.08


def measure(config: str, batch: int, steps: int) -> dict[str, Any]:
    """Step `batch` active slots `steps` times (after the engine's warm-up)."""
    section = DuplexSection(
        engine="moshi-random",
        use_sampling=False,
        random=CONFIGS[config],
        moshi=MoshiSettings(device="cpu"),
    )
    engine = random_engine(section)
    engine.load(batch)
    rng = np.random.default_rng(0)
    active, none = np.ones(batch, bool), np.zeros(batch, bool)
    times = []
    for index in range(steps + 2):  # the first two steps of a session make no audio
        audio = (0.1 * rng.standard_normal((batch, engine.frame_samples))).astype(np.float32)
        started = time.perf_counter()
        engine.step(StepInput(audio, active, active if index == 0 else none))
        if index >= 2:
            times.append((time.perf_counter() - started) * 1000)
    p50 = percentile(times, 50)
    return {
        "config": config,
        "batch": batch,
        "steps": steps,
        "step_ms_p50": round(p50, 2),
        "step_ms_p90": round(percentile(times, 90), 2),
        "step_ms_max": round(max(times), 2),
        "ms_per_session_p50": round(p50 / batch, 2),
        "realtime": p50 <= FRAME_S * 1000,
        "state_bytes_per_slot": engine.state_bytes_per_slot(),
    }


def real_config_memory(slots: int = 2) -> dict[str, Any]:
    """Weights and per-session streaming state of Moshi 7B + Mimi, counted on `meta`."""
    import torch
    from moshi.models import loaders
    from moshi.models.lm import LMGen

    with torch.device("meta"):
        lm = loaders.get_moshi_lm(None, device="meta", dtype=torch.bfloat16)
        mimi = loaders.get_mimi(None, device="meta")
    weights = sum(p.numel() * p.element_size() for p in lm.parameters())
    mimi_weights = sum(p.numel() * p.element_size() for p in mimi.parameters())
    gen = LMGen(lm, support_out_of_sync=True)
    mimi.streaming_forever(slots)
    gen.streaming_forever(slots)
    lm_state = state_bytes(torch, (gen, lm)) / slots
    mimi_state = state_bytes(torch, (mimi,)) / slots
    context = loaders._lm_kwargs["context"]
    return {
        "what": "Moshi 7B (moshiko/moshika, bf16) and Mimi (float32) as moshi builds them, on "
        "the meta device: bytes counted from the parameters and the streaming state",
        "lm_weights_bytes": weights,
        "mimi_weights_bytes": mimi_weights,
        "lm_state_bytes_per_session": round(lm_state),
        "mimi_state_bytes_per_session": round(mimi_state),
        "state_bytes_per_session": round(lm_state + mimi_state),
        "lm_context_steps": context,
        "lm_context_s": context / 12.5,
        "note": "the LM's KV cache is one ring of `context` steps per layer over the summed "
        "text+user+agent stream (no separate user/agent caches); activations and the "
        "allocator's slack are not counted: measure VRAM on a GPU",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", default="1,2,3,4,5,6,8")
    parser.add_argument("--configs", default="tiny,small")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    import torch

    for config in args.configs.split(","):  # discarded: the process's first runs of torch
        measure(config, 1, args.steps)  # kernels are slow whatever the batch
    rows = []
    for config in args.configs.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            row = measure(config, batch, args.steps)
            print(row, flush=True)
            rows.append(row)
    body = {
        "benchmark": "duplex_steps",
        "device": "cpu",
        "torch_threads": torch.get_num_threads(),
        "versions": versions("torch", "moshi", "numpy"),
        "configs": {name: CONFIGS[name].model_dump() for name in args.configs.split(",")},
        "levels": rows,
        "real_config_memory": real_config_memory(),
    }
    write(args.out, body)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
