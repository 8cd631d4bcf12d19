"""`voice-agent loadtest` pieces without a server: contract checks, stages, statistics,
levels, bottlenecks, server samples, the progress line, plots and the command line."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

import pytest

from services.client.stream import write_wav
from services.loadtest.breakdown import Histogram, engine_ms
from services.loadtest.capacity import MIN_P95_SAMPLES
from services.loadtest.cli import add_loadtest_command, main
from services.loadtest.contract import Conversation
from services.loadtest.level import LevelPart, judge, level_report, mark_growth
from services.loadtest.plots import write_plots
from services.loadtest.progress import ProgressLine
from services.loadtest.server import Sample, http_base, level_histograms, server_report
from services.loadtest.stats import STAGES, TurnRecord, stats, turn_figures, word_accuracy
from services.loadtest.user import SessionRun, UserPlan, Window
from services.loadtest.workers import Snapshot, split
from services.ops.redis_server import free_port

FRAME = bytes(2 * 24 * 40)  # 40 ms of 24 kHz PCM16
Message = tuple[float, dict[str, Any] | bytes]


def utterance(uid: str, start: float, stop: float, text: str, final_at: float) -> list[Message]:
    return [
        (start, {"type": "speech.started", "utterance_id": uid, "audio_start_ms": 0}),
        (stop, {"type": "speech.stopped", "utterance_id": uid, "audio_end_ms": 2000}),
        (final_at, {"type": "transcript.final", "utterance_id": uid, "text": text}),
    ]


def response(
    rid: str, uid: str | None, at: float, frames: int, status: str = "completed"
) -> list[Message]:
    out: list[Message] = [
        (at, {"type": "response.created", "response_id": rid, "utterance_id": uid})
    ]
    out += [(at + 0.01 + 0.04 * i, FRAME) for i in range(frames)]
    end = at + 0.02 + 0.04 * frames
    out.append((end, {"type": "response.audio.done", "response_id": rid, "audio_ms": 40 * frames}))
    out.append((end, {"type": "response.done", "response_id": rid, "status": status, "text": ""}))
    return out


def fed(*messages: Message, close: int | None = 1000, asked: bool = True) -> Conversation:
    conversation = Conversation("s1")
    for at, message in messages:
        conversation.feed(at, message)
    conversation.connection_closed(close, asked)
    conversation.finish()
    return conversation


# ---------------------------------------------------------------- the contract


def test_a_well_behaved_conversation_has_no_violations() -> None:
    conversation = fed(
        *utterance("u1", 1.0, 3.0, "hello there", 3.3), *response("r1", "u1", 3.31, 10)
    )
    assert conversation.violations == []
    assert conversation.settled()
    assert conversation.responses["r1"].audio_ms == pytest.approx(400)


def test_two_finals_for_one_utterance_is_a_violation() -> None:
    messages = utterance("u1", 1.0, 3.0, "hello", 3.3)
    again = (3.4, {"type": "transcript.final", "utterance_id": "u1", "text": "hello"})
    conversation = fed(*messages, again)
    assert conversation.violations == ["session s1: two transcript.final for utterance u1"]


def test_audio_after_response_done_is_a_violation_reported_once() -> None:
    conversation = fed(*response("r1", None, 1.0, 3), (2.0, FRAME), (2.1, FRAME))
    assert conversation.violations == [
        "session s1: agent audio after response.done (last response: none)"
    ]


def cleared(status: str) -> list[Message]:
    """Response r1: one frame, output_audio.clear, then response.done with `status`."""
    return [
        (1.0, {"type": "response.created", "response_id": "r1"}),
        (1.1, FRAME),
        (1.2, {"type": "output_audio.clear", "response_id": "r1"}),
        (1.3, {"type": "response.done", "response_id": "r1", "status": status, "text": ""}),
    ]


def test_audio_after_output_audio_clear_is_a_violation() -> None:
    conversation = fed(*sorted([*cleared("cancelled"), (1.25, FRAME)], key=lambda m: m[0]))
    assert conversation.violations == [
        "session s1: agent audio after output_audio.clear (last response: r1)"
    ]


def test_cleared_response_must_end_cancelled_and_every_response_must_end() -> None:
    conversation = fed(
        *cleared("completed"), (2.0, {"type": "response.created", "response_id": "r2"})
    )
    assert conversation.violations == [
        "session s1: r1 got output_audio.clear but ended 'completed'",
        "session s1: no response.done for r2",
    ]


def test_missing_final_is_a_violation_unless_an_asr_error_explains_it() -> None:
    start = (1.0, {"type": "speech.started", "utterance_id": "u1", "audio_start_ms": 0})
    stop = (2.0, {"type": "speech.stopped", "utterance_id": "u1", "audio_end_ms": 900})
    assert fed(start, stop).violations == [
        "session s1: no transcript.final (nor error) for utterance u1"
    ]
    error = (9.0, {"type": "error", "code": "asr_unavailable", "message": "x", "fatal": False})
    explained = fed(start, stop, error)
    assert explained.violations == [] and explained.errors == [(9.0, "asr_unavailable")]


def test_ignored_barge_in_is_a_violation_but_a_short_overlap_is_not() -> None:
    playing = response("r1", None, 1.0, 50)  # 2 s of audio
    # The user starts talking 0.2 s into it and keeps on for 1.5 s: 1.8 s more audio came.
    over = utterance("u2", 1.25, 3.5, "stop", 3.6)
    over[1] = (3.5, {"type": "speech.stopped", "utterance_id": "u2", "audio_end_ms": 1500})
    ignored = fed(*sorted(playing + over, key=lambda m: m[0]))
    assert len(ignored.violations) == 1 and "barge-in ignored: r1" in ignored.violations[0]
    # Talking over the last moments of a reply: it may well complete.
    late = utterance("u3", 2.9, 4.0, "ok", 4.1)
    late[1] = (4.0, {"type": "speech.stopped", "utterance_id": "u3", "audio_end_ms": 1500})
    assert fed(*sorted(playing + late, key=lambda m: m[0])).violations == []


def test_unexpected_close_is_a_violation_but_capacity_is_only_an_error() -> None:
    assert fed(close=1011, asked=False).violations == [
        "session s1: connection closed unexpectedly (code 1011)"
    ]
    assert fed(close=None, asked=True).violations == [
        "session s1: session.close answered with close code None"
    ]
    at_capacity = fed(close=1013, asked=False)
    assert at_capacity.violations == [] and at_capacity.closed_by_server


def test_audio_done_must_match_the_audio_sent() -> None:
    messages = response("r1", None, 1.0, 5)
    messages[-2] = (1.3, {"type": "response.audio.done", "response_id": "r1", "audio_ms": 400})
    assert fed(*messages).violations == [
        "session s1: response.audio.done for r1 says 400 ms, 200 ms arrived"
    ]


def test_stall_is_the_worst_gap_a_player_would_hear() -> None:
    conversation = fed(
        (1.0, {"type": "response.created", "response_id": "r1"}),
        (1.0, FRAME),
        (1.04, FRAME),
        (1.5, FRAME),  # 80 ms of audio had come in 500 ms: a 420 ms gap
        (1.6, {"type": "response.done", "response_id": "r1", "status": "completed", "text": ""}),
    )
    assert conversation.responses["r1"].stall_ms == pytest.approx(420)


# ---------------------------------------------------------------- stages


def test_turn_stages_come_from_the_client_and_server_times() -> None:
    conversation = fed(
        *utterance("u1", 1.3, 3.6, "what is your name", 3.9),
        *response("r1", "u1", 3.905, 10),
    )
    turn = TurnRecord("what is your name", started_at=1.0, last_sent_at=3.0)
    (figures,) = turn_figures(conversation, [turn])
    assert figures.completed and figures.accuracy == 1.0
    stages = {k: round(v, 1) for k, v in figures.stages.items()}
    assert stages == {
        "end_of_turn": 600.0,
        "asr": 300.0,
        "response": 15.0,
        "voice_to_voice": 915.0,
        "gateway_added": 315.0,
    }


def test_barge_in_turn_measures_time_to_silence() -> None:
    playing = response("r1", None, 1.0, 50, status="cancelled")
    playing = [m for m in playing if m[0] <= 1.5 or not isinstance(m[1], bytes)]
    playing = [
        m for m in playing if not (isinstance(m[1], dict) and m[1]["type"] == "response.audio.done")
    ]
    over = utterance("u2", 1.45, 3.0, "stop", 3.2)
    conversation = fed(*sorted(playing + over, key=lambda m: m[0]))
    turn = TurnRecord("stop", started_at=1.2, barge_in=True, last_sent_at=2.4)
    (figures,) = turn_figures(conversation, [turn])
    assert figures.stages["time_to_silence"] == pytest.approx(40.0)  # 1.45 → 1.49
    assert not figures.completed  # no reply to the interruption came


def test_word_accuracy_is_one_minus_wer_clipped() -> None:
    assert word_accuracy("What is your name?", "what is your name") == 1.0
    assert word_accuracy("tell me a story", "tell me a glory") == 0.75
    assert word_accuracy("hi", "oh no not this at all") == 0.0
    assert word_accuracy("hi", "") == 0.0
    assert word_accuracy("", "anything") is None


def test_stats_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert stats(values) == {
        "count": 100,
        "p50": 50.0,
        "p95": 95.0,
        "p99": 99.0,
        "mean": 50.5,
        "max": 100.0,
    }
    assert stats([])["count"] == 0 and stats([])["p95"] is None


# ---------------------------------------------------------------- levels


def run_of(v2v_s: float, errors: int = 0) -> SessionRun:
    conversation = fed(
        *utterance("u1", 1.3, 3.6, "where do you live", 3.9),
        *response("r1", "u1", 3.0 + v2v_s, 10),
        *[(9.0, {"type": "error", "code": "tts_unavailable", "message": "", "fatal": False})]
        * errors,
    )
    turns = [TurnRecord("where do you live", 1.0, last_sent_at=3.0)]
    return SessionRun(conversation, turns, send_lag_ms=[1.0, 2.0])


def level_of(
    sessions: int, v2v_s: float, budget_ms: float = 2000.0, turns: int = MIN_P95_SAMPLES
) -> dict[str, Any]:
    """A level of `turns` answered turns (one per simulated session record)."""
    part = LevelPart()
    for _ in range(turns):
        part.add_session(run_of(v2v_s))
    level = level_report(part, sessions, 10.0, engine_ms=200.0, server={})
    judge(level, budget_ms)
    return level


def test_level_report_fills_the_schema() -> None:
    part = LevelPart()
    part.add_session(run_of(1.0, errors=1))
    part.add_session(SessionRun(Conversation(), connect_error="connect_failed"))
    other = LevelPart()
    other.add_session(run_of(1.2))
    part.merge(other)
    level = level_report(part, 3, 10.0, engine_ms=250.0, server={"gateway": None})
    assert level["turns"] == 2 and level["turns_completed"] == 2 and level["turns_per_s"] == 0.2
    assert (level["lost_turns"], level["refused_sessions"]) == (0, 1)
    assert level["errors"] == {"connect_failed": 1, "tts_unavailable": 1}
    assert level["error_rate"] == pytest.approx(2 / 3, abs=1e-4)
    assert level["stages_ms"]["voice_to_voice"]["count"] == 2
    # (first audio - speech.stopped) - engine time: (4.01 - 3.6) s - 250 ms, (4.21 - 3.6) s - 250 ms
    assert level["samples_ms"]["gateway_added"] == [160.0, 360.0]
    assert level["word_accuracy"] == {"mean": 1.0, "count": 2}
    assert level["audio_kept_up"] is True
    assert level["client"]["send_lag_ms"] == {"p50": 1.0, "p99": 2.0, "max": 2.0}  # 1,1,2,2
    assert set(level["stages_ms"]) == set(STAGES)
    # a session refused: not within any budget however fast the others were answered
    assert judge(level, 5000.0) == "over" and level["within_budget"] is False
    assert level["over_budget"] == "1 of 3 sessions could not connect"


def test_turns_whose_end_took_over_a_second_are_listed_with_what_was_heard() -> None:
    slow = fed(
        *utterance("u1", 1.3, 2.0, "where do you", 2.3),
        *utterance("u2", 2.4, 4.2, "live", 4.5),
        *response("r1", "u2", 4.6, 10),
    )
    part = LevelPart()
    part.add_session(SessionRun(slow, [TurnRecord("where do you live", 1.0, last_sent_at=3.0)]))
    part.add_session(run_of(1.0))  # its end took 600 ms: not listed
    (listed,) = level_report(part, 2, 10.0, engine_ms=None, server={})["slow_turns"]
    assert listed["script"] == "where do you live" and listed["heard"] == "where do you live"
    assert (listed["utterances"], listed["barge_in"]) == (2, False)
    assert listed["stages_ms"]["end_of_turn"] == 1200.0


def test_a_level_is_judged_by_its_voice_to_voice_p95_and_the_client_stage_that_grew() -> None:
    levels = [level_of(1, 1.0), level_of(2, 1.1), level_of(4, 2.5), level_of(8, 3.0)]
    assert [level["within_budget"] for level in levels] == [True, True, False, False]
    assert levels[2]["over_budget"] == "voice-to-voice p95 2510 ms > budget 2000 ms"  # +10 ms
    mark_growth(levels)  # no services' metrics here: the client stages tell
    assert [level["grows"] for level in levels] == [None, "response", "response", "response"]
    unknown = level_of(1, 1.0)
    assert judge(unknown, None) == "over"
    assert unknown["over_budget"] == "no budget: the one-session level answered no turn"


def test_sessions_are_dealt_round_robin_to_workers() -> None:
    plan = UserPlan("ws://x", ())
    jobs = split(plan, Window(0.0, ramp_s=1.0, duration_s=1.0, sessions=5), workers=2)
    assert [job.indices for job in jobs] == [(0, 2, 4), (1, 3)]
    assert len(split(plan, Window(0.0, ramp_s=1.0, duration_s=1.0, sessions=1), workers=4)) == 1


# ---------------------------------------------------------------- server samples


def health(cpu_seconds: float, rss: int) -> dict[str, Any]:
    return {
        "process": {"rss_bytes": rss, "cpu_seconds": cpu_seconds},
        "queue_depth": 3,
        "event_loop_lag_ms": {"window_s": 10, "p50": 0.4, "p99": 3.0, "max": 9.0, "samples": 200},
        "gpu": {"available": True, "memory_allocated": 1024},
    }


def hist(total_s: float, count: float) -> Histogram:
    return Histogram(total_s, count, ((1.0, count), (float("inf"), count)))


def test_server_figures_and_engine_time_come_from_two_samples() -> None:
    start = {
        "asr": Sample(100.0, health(10.0, 1), {"asr_latency": hist(5.0, 20.0)}),
        "tts": Sample(100.0, health(0.0, 1), {"tts_first_piece": hist(1.0, 40.0)}),
        "gateway": None,
    }
    end = {
        "asr": Sample(110.0, health(14.0, 2), {"asr_latency": hist(8.0, 30.0)}),  # 10 took 3 s
        "tts": Sample(110.0, health(0.5, 2), {"tts_first_piece": hist(1.5, 50.0)}),  # 0.5 s
        "gateway": None,
    }
    assert engine_ms(level_histograms(start), level_histograms(end)) == pytest.approx(350.0)
    report = server_report(start, end)
    assert report["gateway"] is None
    assert report["asr"]["cpu_percent"] == 40.0
    assert report["asr"]["rss_bytes"] == 2 and report["asr"]["gpu_memory_used_bytes"] == 1024
    assert report["asr"]["event_loop_lag_ms"]["p99"] == 3.0
    assert engine_ms({}, {}) is None
    assert http_base("wss://example.com:8443/v1/stream?x=1") == "https://example.com:8443"


# ---------------------------------------------------------------- progress and plots


def test_progress_line_is_plain_text_off_a_terminal() -> None:
    stream = io.StringIO()
    line = ProgressLine(stream, levels=2)
    line.start_level(Window(0.0, ramp_s=5.0, duration_s=60.0, sessions=10))
    text = line.text(Snapshot(up=7, turns=12, errors=1, v2v_ms=[900.0, 1100.0, 1000.0]), 3.0)
    assert text == (
        "level 1/2: 10 sessions, ramp 2 s | up 7 | turns 12 | errors 1 | v2v p50 1000 ms"
    )
    ramping = Snapshot(up=7, turns=0, errors=0, v2v_ms=[], ramp_turns=3)
    assert "| turns 0 (+3 in ramp) |" in line.text(ramping, 3.0)
    line(Snapshot(up=1))
    line(Snapshot(up=2))  # within the plain-text interval: not shown
    assert stream.getvalue().count("\n") == 1 and "\r" not in stream.getvalue()


def test_plots_are_written(tmp_path: Path) -> None:
    levels = [level_of(1, 1.0), level_of(3, 1.5)]
    levels[1]["breakdown_ms"] = {"hearing": {"mean": 600.0}, "asr_compute": {"mean": 200.0}}
    result = {"budget": {"ms": 1500.0, "rule": "given"}, "levels": levels}
    paths = write_plots(result, tmp_path / "plots")
    assert [p.name for p in paths] == [
        "latency_cdf.png",
        "latency_vs_sessions.png",
        "breakdown_vs_sessions.png",
    ]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


# ---------------------------------------------------------------- command line


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as bad_list:
        main(["--sessions", "1,x"])
    assert bad_list.value.code == 2
    with pytest.raises(SystemExit) as bad_think:
        main(["--think-s", "3,1"])
    assert bad_think.value.code == 2
    assert main(["--url", "http://127.0.0.1:1/v1/stream"]) == 2
    assert "ws:// or wss://" in capsys.readouterr().err


def test_no_server_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    url = f"ws://127.0.0.1:{free_port()}/v1/stream"
    assert main(["--url", url, "--audio", str(tmp_path), "--out", str(out)]) == 2
    assert "no .wav files" in capsys.readouterr().err
    (tmp_path / "a.wav").write_bytes(b"not a wav")
    assert main(["--url", url, "--audio", str(tmp_path)]) == 2
    write_wav(tmp_path / "a.wav", bytes(3200), 16000)  # 0.1 s of silence
    assert main(["--url", url, "--audio", str(tmp_path), "--out", str(out)]) == 2
    assert "cannot open a session" in capsys.readouterr().err
    assert not out.exists()


def test_the_subcommand_registers_on_a_cli() -> None:
    parser = argparse.ArgumentParser(prog="voice-agent")
    add_loadtest_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["loadtest", "--sessions", "1,5,10", "--think-s", "0.5,2"])
    assert args.sessions == [1, 5, 10] and args.think_s == (0.5, 2.0)
    older = parser.parse_args(["loadtest", "--pause", "1,3"])  # the option's former name
    assert older.think_s == (1.0, 3.0) and older.budget_ms is None
    assert args.func.__name__ == "run" and json.dumps(vars(args), default=str)
