"""Capacity as users feel it: the budget rule, the levels it judges, where voice-to-voice
went (the services' histograms, differenced) and what the run prints."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import Histogram as PromHistogram
from prometheus_client.parser import text_string_to_metric_families

from services.loadtest.breakdown import Histogram, breakdown, growing_stage, histograms
from services.loadtest.capacity import Budget, LevelFigures, budget_from, find_capacity
from services.loadtest.cli import add_arguments, capacity_of, levels_to_run
from services.loadtest.contract import Conversation
from services.loadtest.summary import summary_text

# ---------------------------------------------------------------- the rule


def test_the_default_budget_is_half_again_the_one_session_p95_never_under_a_second() -> None:
    assert budget_from(900.0) == Budget(1350.0, "max(1.5 × one-session p95 900 ms, 1000 ms)", 900)
    assert budget_from(500.0) == Budget(1000.0, "max(1.5 × one-session p95 500 ms, 1000 ms)", 500)
    assert budget_from(None) is None
    assert budget_from(None, given_ms=800.0) == Budget(800.0, "given", None)
    doubled = budget_from(900.0, factor=2.0, floor_ms=0.0)
    assert doubled is not None and doubled.ms == 1800.0


def levels(*rows: tuple[int, float | None, int]) -> list[LevelFigures]:
    return [LevelFigures(n, p95, lost) for n, p95, lost in rows]


def test_capacity_is_the_last_level_before_the_first_over_the_budget() -> None:
    found = find_capacity(levels((1, 700, 0), (2, 800, 0), (4, 1100, 0), (8, 900, 0)), 1000.0)
    assert (found.sessions, found.over_at, found.at_least) == (2, 4, False)
    assert found.why == "voice-to-voice p95 1100 ms > budget 1000 ms"
    assert found.index == 1 and found.noisy  # 8 was within again: a noisy run


def test_a_lost_turn_or_a_refused_session_ends_it_too() -> None:
    lost = find_capacity(levels((1, 700, 0), (2, 720, 2)), 1000.0)
    assert (lost.sessions, lost.over_at, lost.why) == (1, 2, "2 lost turns")
    refused = find_capacity([LevelFigures(1, 700, 0), LevelFigures(3, 700, 0, 1)], 1000.0)
    assert refused.why == "1 of 3 sessions could not connect"
    unanswered = find_capacity(levels((1, None, 0)), 1000.0)
    assert (unanswered.sessions, unanswered.why) == (None, "no turn answered")


def test_every_level_within_means_at_least_the_largest_in_any_order() -> None:
    found = find_capacity(levels((4, 900, 0), (1, 700, 0)), 1000.0)
    assert (found.sessions, found.at_least, found.index) == (4, True, 0)


# ---------------------------------------------------------------- histograms


def test_a_histogram_difference_gives_the_mean_and_an_interpolated_p95() -> None:
    before = Histogram(1.0, 10, ((0.1, 10), (0.5, 10), (1.0, 10), (float("inf"), 10)))
    after = Histogram(31.0, 110, ((0.1, 10), (0.5, 60), (1.0, 110), (float("inf"), 110)))
    level = after.minus(before)  # 100 jobs: 50 in (0.1, 0.5], 50 in (0.5, 1.0]; 30 s in all
    assert level.mean() == pytest.approx(0.3)
    # rank 95 of 100 lies 45/50 of the way through (0.5, 1.0]
    assert level.quantile(0.95) == pytest.approx(0.95)
    assert level.quantile(0.5) == pytest.approx(0.5)
    overflow = Histogram(9.0, 2, ((1.0, 0), (float("inf"), 2)))
    assert overflow.quantile(0.95) == 1.0  # past the last bound: that bound, a lower bound
    assert Histogram(0.0, 0, ()).mean() is None and Histogram(0.0, 0, ()).quantile(0.9) is None


def test_histograms_are_read_from_a_metrics_page_by_label() -> None:
    registry = CollectorRegistry()
    wait = PromHistogram(
        "va_asr_queue_wait_seconds", "w", ["mode"], buckets=(0.1, 1.0), registry=registry
    )
    wait.labels("final").observe(0.05)
    wait.labels("final").observe(0.5)
    wait.labels("partial").observe(3.0)  # not a final: left out
    text = generate_latest(registry).decode()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    found = histograms(samples, "asr")
    assert set(found) == {"asr_queue_wait"}
    assert found["asr_queue_wait"].count == 2 and found["asr_queue_wait"].sum == pytest.approx(0.55)
    assert found["asr_queue_wait"].buckets == ((0.1, 1.0), (1.0, 2.0), (float("inf"), 2.0))
    assert histograms(samples, "tts") == {}


def h(mean_s: float, count: int = 10) -> Histogram:
    return Histogram(mean_s * count, count, ((10.0, count), (float("inf"), count)))


def test_the_breakdown_measures_stages_and_derives_the_rest() -> None:
    end = {
        "hearing": h(0.6),
        "gateway_asr": h(0.75),
        "asr_queue_wait": h(0.1),
        "asr_compute": h(0.2),
        "agent": h(0.0),
        "gateway_tts": h(0.4),
        "tts_queue_wait": h(0.15),
        "tts_first_piece": h(0.2),
        "gateway_v2v": h(1.2),
    }
    stages = breakdown({}, end, client_v2v_mean_ms=1250.0)
    means = {stage: figures["mean"] for stage, figures in stages.items()}
    assert means == {
        "hearing": 600.0,
        "asr_queue_wait": 100.0,
        "asr_compute": 200.0,
        "agent": 0.0,
        "tts_queue_wait": 150.0,
        "tts_first_piece": 200.0,
        "asr_after_turn": 150.0,  # round trip 750 − hearing 600
        "pacing": 50.0,  # gateway's first audio 400 − TTS wait 150 − first piece 200
        "delivery": 50.0,  # the client's 1250 − the gateway's 1200
    }
    assert stages["hearing"]["count"] == 10 and stages["pacing"]["p95"] is None
    # the same histograms at the window's start: nothing happened in the level
    assert breakdown(end, end, None) == {}


def test_the_stage_that_grows_is_the_largest_growth_of_a_mean() -> None:
    first = {"hearing": {"mean": 600.0}, "asr_queue_wait": {"mean": 10.0}}
    later = {"hearing": {"mean": 640.0}, "asr_queue_wait": {"mean": 400.0}}
    assert growing_stage(first, later) == "asr_queue_wait"
    assert growing_stage(later, first) is None  # nothing grew
    assert growing_stage({}, later) is None


# ---------------------------------------------------------------- the run


def args_of(*words: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(words))


def test_levels_run_smallest_first_with_a_one_session_level_for_the_budget() -> None:
    assert levels_to_run(args_of("--sessions", "8,2,4")) == [1, 2, 4, 8]
    assert levels_to_run(args_of("--sessions", "8,2,4", "--budget-ms", "900")) == [2, 4, 8]
    assert levels_to_run(args_of("--sessions", "1,1,3")) == [1, 3]


def level(sessions: int, p95: float, within: bool, grows: str | None = None) -> dict[str, Any]:
    return {
        "sessions": sessions,
        "turns": 10,
        "lost_turns": 0,
        "refused_sessions": 0,
        "barge_ins": 1,
        "stages_ms": {
            "voice_to_voice": {"p50": p95 - 100, "p95": p95},
            "asr": {"p50": 100.0, "p95": 200.0},
        },
        "breakdown_ms": {"hearing": {"mean": 600.0}, "asr_queue_wait": {"mean": p95 / 10}},
        "word_accuracy": {"mean": 0.9},
        "errors": {},
        "within_budget": within,
        "over_budget": None if within else f"voice-to-voice p95 {p95:.0f} ms > budget 1200 ms",
        "grows": grows,
    }


def test_the_run_reports_its_budget_capacity_and_where_the_time_went() -> None:
    budget = Budget(1200.0, "max(1.5 × one-session p95 800 ms, 1000 ms)", 800.0)
    run = [level(1, 800, True), level(4, 1000, True), level(8, 1900, False, "asr_queue_wait")]
    capacity = capacity_of(run, budget)
    assert capacity == {
        "sessions": 4,
        "at_least": False,
        "over_at": 8,
        "why": "voice-to-voice p95 1900 ms > budget 1200 ms",
        "grows": "asr_queue_wait",
        "noisy": False,
    }
    result = {
        "levels": run,
        "budget": {"ms": budget.ms, "rule": budget.rule},
        "capacity": capacity,
        "contract_violations": [],
        "ok": True,
    }
    text = summary_text(result).splitlines()
    assert text[2].startswith("8 sessions: 10 turns (0 lost, 1 barge-ins), v2v p50/p95 1800/1900")
    assert text[2].endswith(
        "OVER: voice-to-voice p95 1900 ms > budget 1200 ms, grows: asr_queue_wait"
    )
    assert text[3:7] == [
        "mean ms by stage: sessions | hearing | asr_queue_wait",
        "  1 | 600 | 80",
        "  4 | 600 | 100",
        "  8 | 600 | 190",
    ]
    assert text[-3:] == [
        "budget: voice-to-voice p95 1200 ms (max(1.5 × one-session p95 800 ms, 1000 ms))",
        "capacity: 4 sessions; over at 8 (voice-to-voice p95 1900 ms > budget 1200 ms; "
        "grows: asr_queue_wait)",
        "OK",
    ]
    assert capacity_of(run, None)["sessions"] is None


def test_a_reply_plays_out_after_its_last_frame_arrives() -> None:
    """The user listens to the whole reply: a player fed 40 ms frames, one late."""
    conversation = Conversation("s1")
    conversation.feed(1.0, {"type": "response.created", "response_id": "r1"})
    frame = bytes(2 * 24 * 40)  # 40 ms at 24 kHz
    for at in (1.0, 1.0, 1.0, 1.5):  # three at once, then one after the buffer ran dry
        conversation.feed(at, frame)
    assert conversation.responses["r1"].played_until == pytest.approx(1.54)
