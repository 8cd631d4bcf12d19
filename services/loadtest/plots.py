"""PNG plots of a load test: latency CDFs per stage, percentiles against concurrency, and
where voice-to-voice went (the services' stage means) against concurrency.

matplotlib with the Agg backend (no display needed); it is imported only when plots
are asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from services.loadtest.stats import STAGES
from services.loadtest.summary import BREAKDOWN_ORDER

CDF_FILE = "latency_cdf.png"
PERCENTILES_FILE = "latency_vs_sessions.png"
BREAKDOWN_FILE = "breakdown_vs_sessions.png"


def write_plots(result: dict[str, Any], folder: Path) -> list[Path]:
    """The figures of a results file into `folder` (the breakdown when the services'
    metrics were read); their paths."""
    import matplotlib

    matplotlib.use("Agg")
    folder.mkdir(parents=True, exist_ok=True)
    paths = [_cdf(result, folder / CDF_FILE), _percentiles(result, folder / PERCENTILES_FILE)]
    if any(level.get("breakdown_ms") for level in result["levels"]):
        paths.append(_breakdown(result, folder / BREAKDOWN_FILE))
    return paths


def _grid(title: str) -> tuple[Any, list[Any]]:
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 3, figsize=(15, 8), constrained_layout=True)
    figure.suptitle(title)
    return figure, list(axes.flat)


def _save(figure: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def _cdf(result: dict[str, Any], path: Path) -> Path:
    """One panel per stage, one line per concurrency level."""
    figure, axes = _grid("Latency CDF per stage (client side), one line per concurrency level")
    for axis, stage in zip(axes, STAGES, strict=True):
        for level in result["levels"]:
            values = sorted(level["samples_ms"].get(stage, []))
            if values:
                shares = [(i + 1) / len(values) for i in range(len(values))]
                axis.step(values, shares, where="post", label=f"{level['sessions']} sessions")
        axis.set_ylim(0, 1.02)
        _finish(axis, result, stage, "ms", "fraction of turns", slo_vertical=True)
    return _save(figure, path)


def _percentiles(result: dict[str, Any], path: Path) -> Path:
    """One panel per stage: p50, p95 and p99 against the number of sessions."""
    figure, axes = _grid("Latency percentiles per stage against concurrent sessions")
    sessions = [level["sessions"] for level in result["levels"]]
    for axis, stage in zip(axes, STAGES, strict=True):
        for key, style in (("p50", "o-"), ("p95", "s-"), ("p99", "^-")):
            points = [
                (n, figures[key])
                for n, level in zip(sessions, result["levels"], strict=True)
                if (figures := level["stages_ms"].get(stage) or {}).get(key) is not None
            ]
            if points:
                axis.plot(*zip(*points, strict=True), style, label=key)
        axis.set_xticks(sessions)
        _finish(axis, result, stage, "concurrent sessions", "ms", slo_vertical=False)
    return _save(figure, path)


def _breakdown(result: dict[str, Any], path: Path) -> Path:
    """Each stage's mean against the number of sessions: the one that grows is the limit."""
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(9, 6), constrained_layout=True)
    axis.set_title("Where voice-to-voice went: mean per stage (services' metrics)")
    levels = result["levels"]
    for stage in BREAKDOWN_ORDER:
        points = [
            (level["sessions"], level["breakdown_ms"][stage]["mean"])
            for level in levels
            if (level.get("breakdown_ms") or {}).get(stage, {}).get("mean") is not None
        ]
        if points:
            axis.plot(*zip(*points, strict=True), "o-", label=stage)
    axis.set_xticks([level["sessions"] for level in levels])
    axis.set_xlabel("concurrent sessions")
    axis.set_ylabel("ms")
    axis.grid(alpha=0.3)
    axis.legend(fontsize="small")
    return _save(figure, path)


def _finish(
    axis: Any, result: dict[str, Any], stage: str, xlabel: str, ylabel: str, slo_vertical: bool
) -> None:
    """A panel's budget line (voice-to-voice only), title, labels, grid and legend."""
    budget = (result.get("budget") or {}).get("ms")
    if stage == "voice_to_voice" and budget is not None:
        line = axis.axvline if slo_vertical else axis.axhline
        line(budget, color="red", linestyle="--", linewidth=1, label=f"budget {budget:.0f} ms")
    axis.set_title(stage)
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.grid(alpha=0.3)
    if axis.has_data():
        axis.legend(fontsize="small")
