"""Full-duplex (Moshi) sessions in the plan: the step-time curve `benchmarks/duplex_steps.py`
measured, the memory one session holds as counted from moshi's own classes, and what the
seed documents (000/001, PersonaPlex Scale-5) claim, marked as their claims."""

from __future__ import annotations

import math
from collections.abc import Callable

from services.plan.figures import Figure, derived, fmt, measured
from services.plan.inputs import DuplexSteps
from services.plan.model import DuplexClaim, DuplexPlan, StepRow

GPU_SIZES_GB = (48, 80)
"""The seeds' GPUs: L40S 48 GB, A100 80 GB."""
RUN_GPU = (
    "on a GPU host with pulled weights, run the duplex service (VA_PROFILE=duplex) and read "
    "va_duplex_step_seconds and va_gpu_memory_used_bytes from its /metrics at 1 and 5 "
    "sessions (docs/duplex.md): per-frame p50/p99 and VRAM per session on the real model"
)


def duplex_plan(files: list[DuplexSteps]) -> DuplexPlan | None:
    """The duplex section from the newest duplex_steps file (None without one)."""
    if not files:
        return None
    m = max(files, key=lambda f: f.timestamp)
    rows = []
    for i, level in enumerate(m.levels):
        step = measured(level.step_ms_p50, "ms", m, f"levels[{i}].step_ms_p50")
        per = derived(
            level.step_ms_p50 / level.batch,
            "ms/session",
            f"step p50 ÷ batch = {fmt(level.step_ms_p50)} ÷ {level.batch}",
            [step],
            estimate=False,
        )
        rows.append(
            StepRow(
                config=level.config,
                batch=level.batch,
                step_ms=step,
                ms_per_session=per,
                realtime=level.realtime,
            )
        )
    mem = m.real_config_memory
    weights = _gb(
        measured(
            mem.lm_weights_bytes + mem.mimi_weights_bytes,
            "bytes",
            m,
            "real_config_memory.lm_weights_bytes",
            "real_config_memory.mimi_weights_bytes",
        )
    )
    state = _gb(
        measured(
            mem.state_bytes_per_session, "bytes", m, "real_config_memory.state_bytes_per_session"
        )
    )
    fits = [(gb, _sessions_in(gb, weights, state)) for gb in GPU_SIZES_GB]
    return DuplexPlan(
        device=m.device,
        steps=rows,
        weights=weights,
        state_per_session=state,
        sessions_by_memory=fits,
        claims=_claims(weights, state, dict(fits)),
        missing=[] if m.machine.gpus else [f"no GPU duplex measurement: {RUN_GPU}"],
    )


def _gb(figure: Figure) -> Figure:
    return derived(figure.value / 1e9, "GB", f"{fmt(figure.value)} bytes ÷ 10⁹", [figure], False)


def _sessions_in(gb: int, weights: Figure, state: Figure) -> Figure:
    value = max(0, math.floor((gb - weights.value) / state.value))
    return derived(
        value,
        "sessions",
        f"floor(({gb} GB − weights {fmt(weights.value)} GB) ÷ state per session "
        f"{fmt(state.value)} GB); activations and allocator slack not counted",
        [weights, state],
        estimate=True,
    )


def _claims(weights: Figure, state: Figure, fits: dict[int, Figure]) -> list[DuplexClaim]:
    """The seeds' figures (000/001, VRAM per-session breakdown), each beside ours."""
    return [
        DuplexClaim(
            claim="model weights (INT8), shared",
            theirs="7.0 GB",
            ours=weights,
            how="ours: bf16 Moshi 7B + float32 Mimi, as moshi's loaders build them "
            "(moshi's 8-bit path needs bitsandbytes, not installed)",
        ),
        DuplexClaim(
            claim="KV cache: user stream 0.8 GB + agent stream 0.8 GB per session",
            theirs="1.6 GB",
            ours=state,
            how="ours: one KV ring of 3000 steps per layer over the summed streams "
            "(Moshi keeps no separate user/agent caches) + Mimi's state",
        ),
        DuplexClaim(
            claim="Mimi codec state per session",
            theirs="0.6 GB",
            ours=None,
            how="ours: inside the state per session above (Mimi's part is ~16 MB)",
        ),
        DuplexClaim(
            claim="total per session (weights counted per session)",
            theirs="~8.8 GB",
            ours=state,
            how="ours: weights are shared by every session of the "
            "process; per session only the streaming state grows",
        ),
        DuplexClaim(
            claim="5 sessions on an L40S 48 GB (46 GB)",
            theirs="5",
            ours=fits[48],
            how="ours: sessions whose state fits beside the weights",
        ),
        DuplexClaim(
            claim="5 sessions on an A100 80 GB, 34 GB spare",
            theirs="5",
            ours=fits[80],
            how="ours: as above; the batch's step time decides real time, not memory",
        ),
    ]


def duplex_markdown(view: DuplexPlan, show: Callable[[Figure], str]) -> list[str]:
    """The section; `show` renders one Figure with its footnote."""
    out = ["## Full-duplex sessions (Moshi, one batched step per 80 ms frame)", ""]
    out += [
        f"Step time against batch size on {view.device} with a small random-weight model "
        "(the curve's shape, not a GPU's numbers; real time needs a step under 80 ms):",
        "",
        "| model | sessions in the step | step p50 | per session | real time |",
        "|---|---|---|---|---|",
    ]
    for row in view.steps:
        out.append(
            f"| {row.config} | {row.batch} | {show(row.step_ms)} | "
            f"{show(row.ms_per_session)} | {'yes' if row.realtime else 'no'} |"
        )
    out += [
        "",
        f"Moshi 7B + Mimi, counted from moshi's classes: weights {show(view.weights)} GB, "
        f"streaming state {show(view.state_per_session)} GB per session.",
        "",
        "### The seeds' VRAM claims beside ours (theirs are claims, not measurements)",
        "",
        "| their claim | theirs | ours | how |",
        "|---|---|---|---|",
    ]
    for claim in view.claims:
        ours = show(claim.ours) if claim.ours is not None else "—"
        out.append(f"| {claim.claim} | {claim.theirs} | {ours} | {claim.how} |")
    return out
