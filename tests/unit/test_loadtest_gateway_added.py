"""`gateway_added` (speech.stopped → first agent audio, less the engines' mean time) only
where it means the gateway's own time: both engines watched, and a gateway that did no
engine work before speech.stopped. With speculative transcripts and prepared replies (the
defaults) the engines worked before the turn ended, and the committed lite run's figure came
out negative (p50 −209 to −413 ms); the planner never publishes it as a latency."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.loadtest.breakdown import Histogram, counters, engine_ms, gateway_added_omitted
from services.loadtest.contract import Conversation
from services.loadtest.level import LevelPart, level_report
from services.loadtest.plots import write_plots
from services.loadtest.stats import TurnRecord
from services.loadtest.user import SessionRun
from services.plan.build import build_plan
from services.plan.inputs import load_measurements
from services.plan.model import PlanOptions
from services.plan.render import render_markdown

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "plan"
FRAME = bytes(2 * 24 * 40)


def hist(mean_s: float, count: float = 10.0) -> Histogram:
    return Histogram(mean_s * count, count, ((1.0, count), (float("inf"), count)))


def test_engine_time_needs_both_engines() -> None:
    asr_only = {"asr_latency": hist(0.3)}
    assert engine_ms({}, asr_only) is None  # --asr-url alone: the TTS's time unknown
    assert engine_ms({}, {"tts_first_piece": hist(0.1)}) is None
    both = {**asr_only, "tts_queue_wait": hist(0.05), "tts_first_piece": hist(0.1)}
    assert engine_ms({}, both) == 450.0


def test_the_gateway_speculation_counters_are_read_from_its_metrics() -> None:
    registry = CollectorRegistry()
    early = Counter("va_gateway_speculative_asr", "x", ["outcome"], registry=registry)
    early.labels("used").inc(3)
    early.labels("wasted").inc(2)
    text = generate_latest(registry).decode()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    assert counters(samples, "gateway") == {"speculative_asr": 5.0, "prepared_replies": 0.0}
    assert counters([], "gateway") == {}  # /metrics not read: nothing known
    assert counters(samples, "asr") == {}


def test_gateway_added_is_left_out_where_it_would_mean_nothing() -> None:
    quiet = {"speculative_asr": 7.0, "prepared_replies": 4.0}
    assert gateway_added_omitted(None, quiet, quiet) is not None  # one engine unwatched
    assert gateway_added_omitted(300.0, {}, {}) is not None  # the gateway's metrics unread
    spoke_early = {"speculative_asr": 19.0, "prepared_replies": 4.0}
    why = gateway_added_omitted(300.0, quiet, spoke_early)
    assert why is not None and "12 speculative transcripts" in why
    assert "VA_GATEWAY__SPECULATIVE_ASR=false" in why
    assert gateway_added_omitted(300.0, quiet, quiet) is None  # nothing started early


def _part() -> LevelPart:
    conversation = Conversation("s1")
    messages: list[tuple[float, dict[str, Any] | bytes]] = [
        (1.3, {"type": "speech.started", "utterance_id": "u1", "audio_start_ms": 0}),
        (3.6, {"type": "speech.stopped", "utterance_id": "u1", "audio_end_ms": 2000}),
        (3.9, {"type": "transcript.final", "utterance_id": "u1", "text": "hi"}),
        (3.95, {"type": "response.created", "response_id": "r1", "utterance_id": "u1"}),
        (4.0, FRAME),
        (4.1, {"type": "response.audio.done", "response_id": "r1", "audio_ms": 40}),
        (4.1, {"type": "response.done", "response_id": "r1", "status": "completed"}),
    ]
    for at, message in messages:
        conversation.feed(at, message)
    conversation.connection_closed(1000, True)
    conversation.finish()
    part = LevelPart()
    part.add_session(SessionRun(conversation, [TurnRecord("hi", 1.0, last_sent_at=3.0)]))
    return part


def test_a_level_says_why_gateway_added_is_left_out() -> None:
    why = "the gateway started engine work before speech.stopped"
    level = level_report(_part(), 1, 10.0, engine_ms=600.0, server={}, gateway_added_omitted=why)
    assert level["stages_ms"]["gateway_added"] is None
    assert level["samples_ms"]["gateway_added"] == []
    assert level["gateway_added_omitted"] == why
    assert level["engine_ms"] == 600.0  # still said: what the engines took
    # without both engines' time there is nothing to subtract
    unwatched = level_report(_part(), 1, 10.0, engine_ms=None, server={})
    assert unwatched["stages_ms"]["gateway_added"] is None
    assert "--asr-url and --tts-url" in unwatched["gateway_added_omitted"]
    # where it means something: (4.0 − 3.6) s − 300 ms
    kept = level_report(_part(), 1, 10.0, engine_ms=300.0, server={})
    assert kept["samples_ms"]["gateway_added"] == [100.0]
    assert kept["gateway_added_omitted"] is None


def test_plots_draw_a_level_without_gateway_added(tmp_path: Path) -> None:
    level = level_report(_part(), 1, 10.0, engine_ms=None, server={})
    result = {"budget": None, "levels": [level]}
    assert len(write_plots(result, tmp_path)) == 2


def test_the_plan_publishes_no_gateway_added_latency() -> None:
    """The fixtures' levels all carry a gateway_added stage: the plan shows none of it."""
    found = load_measurements([FIXTURES / "loadtest_dual_gpu.json"])[0]
    plan = build_plan(found, PlanOptions(target_sessions=20))
    latency = plan.setups[0].latency
    assert latency is not None
    assert "gateway_added" not in [s.stage for s in latency.stages]
    assert "gateway_added" not in render_markdown(plan)
    assert "gateway_added" not in json.dumps(json.loads(plan.model_dump_json())["setups"])
