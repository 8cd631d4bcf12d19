"""Per-turn stage latencies from a checked conversation, and their statistics.

Stages (all in ms, measured at the client; see docs/loadtest.md):
end_of_turn      last speech frame sent → speech.stopped received
asr              speech.stopped → transcript.final received
response         transcript.final → first agent audio frame received
voice_to_voice   last speech frame sent → first agent audio frame received
time_to_silence  barge-in turns: speech.started → last audio of the interrupted response
gateway_added    speech.stopped → first agent audio, minus the engines' own time (the
                 level subtracts it: here it is still the whole speech.stopped → audio;
                 the level leaves it out where it means nothing: without both engines'
                 time, or when the gateway did engine work before speech.stopped)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Final

from services.common.stats import percentile
from services.loadtest.contract import Conversation, Response, Utterance

STAGES: Final = (
    "end_of_turn",
    "asr",
    "response",
    "voice_to_voice",
    "time_to_silence",
    "gateway_added",
)
_WORD: Final = re.compile(r"[a-z0-9']+")


@dataclass
class TurnRecord:
    """One thing the simulated user said, from the client's side."""

    script: str | None
    started_at: float
    barge_in: bool = False
    in_window: bool = True
    last_sent_at: float | None = None


@dataclass
class TurnFigures:
    """What one turn measured."""

    stages: dict[str, float] = field(default_factory=dict)
    completed: bool = False
    heard: str = ""
    """What the gateway's transcripts of the turn said, joined."""
    utterances: int = 0
    """How many utterances the gateway heard the turn as."""
    accuracy: float | None = None


def words(text: str) -> str:
    """Lower-case words only, the form word accuracy compares."""
    return " ".join(_WORD.findall(text.lower()))


def word_accuracy(script: str, heard: str) -> float | None:
    """1 − WER of what was heard against the script, clipped at 0 (None: no script)."""
    reference, hypothesis = words(script), words(heard)
    if not reference:
        return None
    if not hypothesis:
        return 0.0
    import jiwer  # the loadtest extra, checked when the command starts

    return max(0.0, 1.0 - float(jiwer.wer(reference, hypothesis)))


def turn_utterances(
    conversation: Conversation, since: float, until: float = math.inf
) -> list[Utterance]:
    """The utterances whose speech.started arrived in [since, until), in order."""
    found = [
        u
        for u in conversation.utterances.values()
        if u.started_at is not None and since <= u.started_at < until
    ]
    return sorted(found, key=lambda u: u.started_at or 0.0)


def answer(conversation: Conversation, mine: list[Utterance]) -> Response | None:
    """The response to a turn: the last one made for its utterances after its transcript."""
    end = mine[-1] if mine else None
    if end is None or end.final_at is None:
        return None
    ids = {u.id for u in mine}
    found = [
        r
        for r in conversation.responses.values()
        if r.utterance_id in ids and r.created_at >= end.final_at
    ]
    return found[-1] if found else None


def turn_figures(conversation: Conversation, turns: list[TurnRecord]) -> list[TurnFigures]:
    """Each turn's stages, whether the agent answered it and how well it was heard."""
    figures = []
    for i, turn in enumerate(turns):
        until = turns[i + 1].started_at if i + 1 < len(turns) else math.inf
        mine = turn_utterances(conversation, turn.started_at, until)
        figures.append(_figures(conversation, turn, mine))
    return figures


def _figures(conversation: Conversation, turn: TurnRecord, mine: list[Utterance]) -> TurnFigures:
    out = TurnFigures(heard=" ".join(u.text for u in mine).strip(), utterances=len(mine))
    if turn.script is not None and any(u.finals for u in mine):
        out.accuracy = word_accuracy(turn.script, " ".join(u.text for u in mine))
    if turn.barge_in:
        out.stages.update(_time_to_silence(conversation, mine))
    end = mine[-1] if mine else None
    sent = turn.last_sent_at
    if sent is None or end is None or end.stopped_at is None:
        return out
    out.stages["end_of_turn"] = (end.stopped_at - sent) * 1000
    if end.final_at is None:
        return out
    out.stages["asr"] = (end.final_at - end.stopped_at) * 1000
    response = answer(conversation, mine)
    if response is None or response.first_audio_at is None:
        return out
    out.completed = True
    out.stages["response"] = (response.first_audio_at - end.final_at) * 1000
    out.stages["voice_to_voice"] = (response.first_audio_at - sent) * 1000
    out.stages["gateway_added"] = (response.first_audio_at - end.stopped_at) * 1000
    return out


def _time_to_silence(conversation: Conversation, mine: list[Utterance]) -> dict[str, float]:
    """speech.started of the interruption → last audio of the response it interrupted."""
    for utterance in mine:
        interrupted = conversation.responses.get(utterance.over_response or "")
        if interrupted is not None and utterance.started_at is not None:
            last = interrupted.last_audio_at or utterance.started_at
            return {"time_to_silence": max(0.0, last - utterance.started_at) * 1000}
    return {}


def stats(values: list[float]) -> dict[str, float | int | None]:
    """count, p50, p95, p99, mean and max (nearest rank, ms rounded to 0.1; None when empty)."""
    if not values:
        return {"count": 0, "p50": None, "p95": None, "p99": None, "mean": None, "max": None}
    return {
        "count": len(values),
        "p50": round(percentile(values, 50), 1),
        "p95": round(percentile(values, 95), 1),
        "p99": round(percentile(values, 99), 1),
        "mean": round(sum(values) / len(values), 1),
        "max": round(max(values), 1),
    }


def lag_stats(values: list[float]) -> dict[str, float | int | None]:
    """p50, p99 and max of lag samples (ms), as `stats` computes them."""
    figures = stats(values)
    return {key: figures[key] for key in ("p50", "p99", "max")}
