"""What the project's seed documents estimated, quoted, so the plan can set ours beside them.

The seeds are planning notes written before anything was measured (shared/seeds/). Each
claim keeps its own assumptions; the plan computes ours under the same assumptions where
it can, from measured files only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class SeedClaim:
    """One figure a seed gives, and the load it assumes."""

    seed: str
    """The seed document, as shared/seeds/ names it."""
    claim: str
    """What the seed says, nearly word for word."""
    kind: Literal["gpus_for_load", "sessions_per_host", "sessions_per_gpu"]
    value: float
    """Its number: GPUs for the load, or sessions per host / per GPU."""
    sessions: int | None = None
    """Concurrent users the claim is for (gpus_for_load)."""
    requests_per_min: float | None = None
    """The load it assumes, in requests (turns) per minute, where it says."""
    where: str = ""
    """The seed file and the part of it the claim is from."""


SEED_CLAIMS: tuple[SeedClaim, ...] = (
    SeedClaim(
        "003 (performance: GPU sizing)",
        "1,000 concurrent users, 200 req/min: 3 GPUs (1 request per user per 5 min at peak)",
        "gpus_for_load",
        3,
        sessions=1_000,
        where="003_b155903001034ceb.txt, GPU Sizing table, row 1,000",
        requests_per_min=200,
    ),
    SeedClaim(
        "003 (performance: GPU sizing)",
        "10,000 concurrent users, 2,000 req/min: 30 GPUs",
        "gpus_for_load",
        30,
        sessions=10_000,
        where="003_b155903001034ceb.txt, GPU Sizing table, row 10,000",
        requests_per_min=2_000,
    ),
    SeedClaim(
        "003 (performance: GPU sizing)",
        "50,000 concurrent users, 10,000 req/min: 150 GPUs",
        "gpus_for_load",
        150,
        sessions=50_000,
        where="003_b155903001034ceb.txt, GPU Sizing table, row 50,000",
        requests_per_min=10_000,
    ),
    SeedClaim(
        "002 (dual RTX 3090)",
        "one dual-GPU host (ASR GPU 0, TTS GPU 1): 30 connections easy, 100 concurrent users "
        "by raising the limits",
        "sessions_per_host",
        100,
        where="002_ca8b786f085f0be1.txt, 30 concurrent connections; scaling option 1",
    ),
    SeedClaim(
        "000/001 (PersonaPlex Scale-5)",
        "5 full-duplex sessions per GPU (L40S 48 GB or A100 80 GB, a 7B speech model, "
        "~8.8 GB VRAM per session); Kubernetes justified from Scale-10+",
        "sessions_per_gpu",
        5,
        where="000_8142f512b3868ebf.txt and 001_77b5abfece40c45a.txt, executive summary",
    ),
)
