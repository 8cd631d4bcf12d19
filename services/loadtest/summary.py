"""What a load test run found, as text for the terminal: a line per level, where the time
went, the budget and the capacity, the contract violations."""

from __future__ import annotations

from typing import Any, Final

from services.loadtest.capacity import MIN_P95_SAMPLES

SHOWN_VIOLATIONS: Final = 20
"""Contract violations the terminal summary lists (the results file has them all)."""
BREAKDOWN_ORDER: Final = (
    "hearing",
    "asr_queue_wait",
    "asr_compute",
    "asr_after_turn",
    "agent",
    "tts_queue_wait",
    "tts_first_piece",
    "pacing",
    "delivery",
)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def level_line(level: dict[str, Any]) -> str:
    """One level in one line."""
    stages = level["stages_ms"]
    v2v, asr = stages["voice_to_voice"], stages["asr"]
    accuracy = level["word_accuracy"]["mean"]
    errors = ", ".join(f"{k} {v}" for k, v in level["errors"].items()) or "none"
    if level.get("too_few_turns"):
        verdict = f"no verdict: {level['too_few_turns']}"
    elif level["within_budget"]:
        verdict = "within budget"
    else:
        verdict = f"OVER: {level['over_budget']}"
    grows = f", grows: {level['grows']}" if level["grows"] else ""
    return (
        f"{level['sessions']} sessions: {level['turns']} turns "
        f"({level['lost_turns']} lost, {level['barge_ins']} barge-ins), "
        f"v2v p50/p95 {_ms(v2v['p50'])}/{_ms(v2v['p95'])} ms, "
        f"asr p95 {_ms(asr['p95'])} ms, "
        f"words {'-' if accuracy is None else f'{accuracy:.2f}'}, errors: {errors}, "
        f"{verdict}{grows}"
    )


def breakdown_lines(levels: list[dict[str, Any]]) -> list[str]:
    """Where voice-to-voice went at each level: the stages' means (ms)."""
    stages = [s for s in BREAKDOWN_ORDER if any(s in lv["breakdown_ms"] for lv in levels)]
    if not stages:
        return []
    lines = ["mean ms by stage: sessions | " + " | ".join(stages)]
    for level in levels:
        cells = [_ms((level["breakdown_ms"].get(stage) or {}).get("mean")) for stage in stages]
        lines.append(f"  {level['sessions']} | " + " | ".join(cells))
    return lines


def summary_text(result: dict[str, Any]) -> str:
    """What the run found, for the terminal."""
    lines = [level_line(level) for level in result["levels"]]
    lines.extend(breakdown_lines(result["levels"]))
    budget, capacity = result["budget"], result["capacity"]
    if budget is not None:
        rule = "given" if budget["rule"] == "given" else budget["rule"]
        lines.append(f"budget: voice-to-voice p95 {budget['ms']:.0f} ms ({rule})")
    if capacity["sessions"] is None:
        lines.append(f"capacity: none ({capacity['why']})")
    else:
        at_least = "at least " if capacity["at_least"] else ""
        where = (
            f"; over at {capacity['over_at']} ({capacity['why']}"
            + (f"; grows: {capacity['grows']})" if capacity["grows"] else ")")
            if capacity["over_at"] is not None
            else ""
        )
        lines.append(f"capacity: {at_least}{capacity['sessions']} sessions{where}")
    unjudged = [str(level["sessions"]) for level in result["levels"] if level.get("too_few_turns")]
    if unjudged:
        lines.append(
            f"no verdict at {', '.join(unjudged)} sessions: too few turns for a voice-to-voice "
            f"p95 (at least {MIN_P95_SAMPLES} each); a longer --duration gives them more"
        )
    violations = result["contract_violations"]
    lines.extend(f"contract violation: {v}" for v in violations[:SHOWN_VIOLATIONS])
    if len(violations) > SHOWN_VIOLATIONS:
        lines.append(f"... and {len(violations) - SHOWN_VIOLATIONS} more contract violations")
    lines.append("OK" if result["ok"] else "FAILED")
    return "\n".join(lines)
