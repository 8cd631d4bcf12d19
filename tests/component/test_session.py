"""The session state machine, driven by scripted audio and fake engines on virtual time.

No sleeps: on a `looptime` event loop the clock jumps to the next timer, so a 15 s ASR
timeout takes no wall time and every timestamp below is exact. (Its pytest plugin is
off for the suite: each test here runs its own loop, through `on_virtual_time`.)
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import pytest

from services.common.audio.vad import VadSettings
from services.common.auth.limits import AudioMeter
from services.common.errors import AgentFailed
from services.common.service.process import RecentSamples
from services.gateway import metrics
from services.gateway.agent import Turn
from services.gateway.settings import GatewaySection
from services.gateway.turn_end import TrailingWordHeuristic
from tests.component.session_harness import (
    Harness,
    on_virtual_time,
    pcm_ms,
    running_session,
    silence,
    tone,
)

MIN_SILENCE_S = VadSettings().min_silence_ms / 1000
PAUSE_S = VadSettings().pause_ms / 1000
WINDOW_S = 512 / 16000


def history(h: Harness) -> list[tuple[str, str]]:
    return [(turn.role, turn.text) for turn in h.session.history]


@on_virtual_time
async def test_one_turn_end_to_end() -> None:
    async with running_session(transcripts=["hello there"]) as h:
        speech_end = await h.say(silence(300), tone(1000))
        await h.say(silence(1000))
        done = await h.wait_for("response.done")
    kinds = [e["type"] for _, e in h.socket.events]
    assert kinds == [
        "speech.started",
        "transcript.partial",
        "speech.stopped",
        "transcript.final",
        "response.created",
        "response.text.delta",
        "response.audio.done",
        "response.done",
    ]
    assert done["status"] == "completed" and done["text"] == "hello there"
    # end of turn: the configured silence after the speech, to a VAD window
    stopped = h.time_of("speech.stopped")
    assert stopped - speech_end == pytest.approx(MIN_SILENCE_S, abs=2 * WINDOW_S)
    # one final job with the utterance (speech plus pre-roll and pad), sent at the pause
    # (`pause_ms` of silence, speculatively) and kept: the transcript is there at the end
    finals = [(t, job, pcm) for t, job, pcm in h.bus.asr_jobs if job.mode == "final"]
    assert len(finals) == 1 and finals[0][0] == pytest.approx(speech_end + PAUSE_S, abs=0.04)
    assert 1000 <= pcm_ms(finals[0][2]) <= 1450
    assert finals[0][1].sample_rate == finals[0][1].source_rate == 16000
    assert h.time_of("transcript.final") == pytest.approx(stopped)
    # 2 words x 400 ms of audio, all of it, paced at real time minus the 200 ms lead; the
    # reply was prepared during the pause (tests/component/test_prepared_reply.py), so its
    # first audio goes out with the final transcript
    first, last = h.socket.audio[0][0], h.socket.audio[-1][0]
    assert first == pytest.approx(h.time_of("transcript.final"), abs=0.01)
    assert h.audio_bytes() == 2 * 16000 * 800 // 1000
    assert last - first == pytest.approx(0.8 - 0.2 - 0.04, abs=0.03)
    assert history(h) == [("user", "hello there"), ("agent", "hello there")]


@on_virtual_time
async def test_a_phone_line_s_jobs_say_the_speech_was_captured_at_8k() -> None:
    """The ASR hears 16 kHz audio either way; `source_rate` tells it the speech is
    telephone-band (services/common/audio/bandwidth.py)."""
    async with running_session(transcripts=["hello there"]) as h:
        await h.send({"type": "session.update", "session": {"input_sample_rate": 8000}})
        await h.wait_for("session.updated")
        await h.say(silence(300, 8000), tone(1000, 8000), silence(1000, 8000), rate=8000)
        await h.wait_for("response.done")
    jobs = [job for _, job, _ in h.bus.asr_jobs]
    assert jobs and {(job.sample_rate, job.source_rate) for job in jobs} == {(16000, 8000)}


@on_virtual_time
async def test_every_frame_is_timed_to_its_vad_result() -> None:
    """/health `timings_ms.hearing`, with or without the VAD batcher (none here)."""
    hearing, metrics.HEARING = metrics.HEARING, RecentSamples()
    try:
        async with running_session() as h:
            await h.say(silence(200), tone(100))  # 15 frames of 20 ms
        timed = metrics.HEARING.summary()["samples"]
    finally:
        metrics.HEARING = hearing
    assert timed == 15


@on_virtual_time
async def test_a_repeated_final_is_dropped() -> None:
    async with running_session(transcripts=["hello there"]) as h:
        await h.say(silence(200), tone(600), silence(900))
        await h.wait_for("response.done")
        _, job, _ = next(j for j in h.bus.asr_jobs if j[1].mode == "final")
        h.bus._asr_result(job, "hello there")  # a reclaimed job's second answer
        await h.say(silence(500))
    assert len(h.of_type("transcript.final")) == 1
    assert len(h.of_type("response.created")) == 1


@on_virtual_time
async def test_partials_are_periodic_and_never_in_trailing_silence() -> None:
    async with running_session(transcripts=["a b"]) as h:
        speech_end = await h.say(silence(200), tone(2600))
        await h.say(silence(1000))
        await h.wait_for("response.done")
    asked = [t for t, job, _ in h.bus.asr_jobs if job.mode == "partial"]
    assert len(asked) == 4  # every 600 ms of speech
    assert all(b - a == pytest.approx(0.6, abs=2 * WINDOW_S) for a, b in itertools.pairwise(asked))
    assert all(t <= speech_end + WINDOW_S for t in asked)
    assert len(h.of_type("transcript.partial")) == 4
    final_at = h.time_of("transcript.final")
    assert all(t < final_at for t, e in h.socket.events if e["type"] == "transcript.partial")


@on_virtual_time
async def test_a_session_that_does_not_show_partials_asks_for_none() -> None:
    async with running_session(partials=False, transcripts=["hello there"]) as h:
        await h.say(silence(300), tone(2500), silence(1000))
        await h.wait_for("response.done")
    assert [job for _, job, _ in h.bus.asr_jobs if job.mode == "partial"] == []
    assert h.of_type("transcript.partial") == []


@on_virtual_time
async def test_at_most_one_partial_in_flight() -> None:
    async with running_session(transcripts=["a b"], answer_partials=False) as h:
        await h.say(silence(200), tone(3000), silence(900))
        await h.wait_for("transcript.final")
    asked = [t for t, job, _ in h.bus.asr_jobs if job.mode == "partial"]
    # unanswered, the next one waits until the last one expires (2 x 600 ms)
    assert len(asked) == 3  # at 0.6, 1.8 and 3.0 s of speech
    assert all(b - a >= 1.2 for a, b in itertools.pairwise(asked))
    assert h.of_type("transcript.partial") == []


@on_virtual_time
async def test_a_late_partial_is_not_sent_after_the_final() -> None:
    async with running_session(transcripts=["a b"], asr_delay_s=0.9) as h:
        await h.say(silence(200), tone(700), silence(1500))
        await h.wait_for("response.done")
    # the partial asked at 600 ms answered after speech.stopped: dropped
    assert len([j for j in h.bus.asr_jobs if j[1].mode == "partial"]) == 1
    assert h.of_type("transcript.partial") == []


async def barge_in(h: Harness, after_audio_s: float, interruption: bytes) -> float:
    await h.say(silence(200), tone(700), silence(700))
    await h.wait_for("response.created")
    while not h.socket.audio:
        await h.say(silence(20))
    await h.say(silence(int(after_audio_s * 1000)))
    return await h.say(interruption)


@on_virtual_time
async def test_barge_in_cancels_end_to_end() -> None:
    before = metrics.INTERRUPTIONS._value.get()
    story = "once upon a time there was a very long story"  # 10 words: 4 s of audio
    async with running_session(transcripts=[story, "stop"]) as h:
        await barge_in(h, 1.0, tone(700))
        await h.say(silence(900))
        await h.wait_for("response.done", 2)
        response_id = h.of_type("response.created")[0]["response_id"]
        cleared = h.time_of("output_audio.clear")
        # whatever the TTS workers still send for it is dropped
        job = h.bus.tts_jobs[0][1]
        h.session.deliver(job.chunk(99), tone(200))
        await h.say(silence(500))
    started = h.time_of("speech.started", 1)
    # cancelled once the user has spoken barge_in_min_ms (300 ms) over the agent
    assert next(r for _, r in h.bus.cancelled) == response_id
    cancel_at = h.bus.cancelled[0][0]
    assert cancel_at - started <= 0.3 - 0.25 + 2 * WINDOW_S  # speech.started comes at 250 ms
    assert cleared == pytest.approx(cancel_at)
    late = [t for t, _ in h.socket.audio if cleared < t < h.time_of("response.created", 1)]
    assert late == []  # not one stale frame after the clear
    time_to_silence = max(t for t, _ in h.socket.audio if t <= cleared) - started
    assert time_to_silence < 0.15
    done = h.of_type("response.done")[0]
    assert done["status"] == "cancelled" and done["response_id"] == response_id
    # heard: what played at the client (sent minus its 200 ms buffer), ~1 s of 4 s
    heard = done["text"]
    assert story.startswith(heard) and 1 <= len(heard.split()) <= 4
    assert metrics.INTERRUPTIONS._value.get() == before + 1
    assert history(h)[:3] == [("user", story), ("agent", heard), ("user", "stop")]
    assert h.of_type("response.done")[1]["status"] == "completed"


@on_virtual_time
async def test_a_reply_that_starts_over_the_user_talking_yields_to_them() -> None:
    """The agent begins to speak while the user is already speaking (the answer to their
    previous turn, late): once they have spoken over it barge_in_min_ms, it stops."""
    before = metrics.INTERRUPTIONS._value.get()
    story = "once upon a time there was a very long story"
    async with running_session(transcripts=[story, "wait"], tts_first_s=1.0) as h:
        await h.say(silence(200), tone(900), silence(700))
        await h.wait_for("speech.stopped")
        await h.say(tone(1500))  # talking again before the reply's first audio (1 s)
        await h.wait_for("output_audio.clear", 1, timeout_s=5)
        await h.say(silence(900))
    first_audio = h.socket.audio[0][0]
    cleared = h.time_of("output_audio.clear")
    assert 0.3 <= cleared - first_audio <= 0.3 + 3 * WINDOW_S  # 300 ms of speech over it
    done = h.of_type("response.done")[0]
    assert done["status"] == "cancelled"
    assert metrics.INTERRUPTIONS._value.get() == before + 1


async def cut_off_then_go_on(h: Harness, after_audio_ms: int = 0) -> None:
    """The user's turn is answered at a pause (600 ms of silence here); they go on
    `after_audio_ms` into the answer's audio, long enough to interrupt it."""
    await h.say(silence(200), tone(700))
    while not h.socket.audio:
        await h.say(silence(20))
    await h.say(silence(after_audio_ms), tone(700), silence(900))
    await h.wait_for("response.done", 2)


PARTS = ("if it rains move the picnic to saturday", "and tell everyone")


@on_virtual_time
async def test_a_user_cut_off_at_a_pause_is_answered_whole() -> None:
    """They go on at once: the answer to the first part is interrupted before a word of
    it was heard, and the two parts are one user turn, answered whole."""
    before = metrics.CUT_OFFS_JOINED._value.get()
    async with running_session(transcripts=list(PARTS)) as h:
        await cut_off_then_go_on(h)
    first, second = h.of_type("response.done")
    assert first["status"] == "cancelled"
    whole = " ".join(PARTS)
    assert second["status"] == "completed" and second["text"] == whole
    assert history(h) == [("user", whole), ("agent", whole)]
    assert metrics.CUT_OFFS_JOINED._value.get() == before + 1


@on_virtual_time
async def test_what_was_heard_of_a_cut_off_answer_leaves_the_history() -> None:
    async with running_session(GatewaySection(cut_off_join_ms=2500), transcripts=list(PARTS)) as h:
        await cut_off_then_go_on(h, after_audio_ms=800)
    first = h.of_type("response.done")[0]
    assert first["status"] == "cancelled" and first["text"]  # some of it was heard
    whole = " ".join(PARTS)
    assert history(h) == [("user", whole), ("agent", whole)]


async def went_on_late(settings: GatewaySection) -> None:
    """They go on 1.4 s after the end of their speech (the answer's first audio came at
    600 ms, then 800 ms of it): a barge-in, and a turn of its own."""
    async with running_session(settings, transcripts=list(PARTS)) as h:
        await cut_off_then_go_on(h, after_audio_ms=800)
    heard = h.of_type("response.done")[0]["text"]
    assert heard
    assert history(h) == [
        ("user", PARTS[0]),
        ("agent", heard),
        ("user", PARTS[1]),
        ("agent", PARTS[1]),
    ]


@on_virtual_time
async def test_speech_after_the_join_window_is_a_turn_of_its_own() -> None:
    await went_on_late(GatewaySection())  # the default window: 1 s


@on_virtual_time
async def test_with_the_join_off_a_cut_off_is_a_turn_of_its_own() -> None:
    await went_on_late(GatewaySection(cut_off_join_ms=0))


@on_virtual_time
async def test_a_first_chunk_cut_inside_a_sentence_is_sent_as_going_on() -> None:
    """The reply's first chunk, cut before a phrase word, tells the TTS its sentence goes
    on (a short pause after it, not a sentence's); the rest does not."""
    words = "please call stella and ask her to bring these things with her"
    async with running_session(transcripts=[words]) as h:
        await h.say(silence(200), tone(700), silence(900))
        await h.wait_for("response.done")
    jobs = [job for _, job in h.bus.tts_jobs]
    assert [(job.text, job.continues) for job in jobs] == [
        ("please call stella and ask her", True),
        ("to bring these things with her", False),
    ]


@on_virtual_time
async def test_a_cough_does_not_interrupt() -> None:
    before = metrics.FALSE_INTERRUPTIONS._value.get()
    story = "once upon a time there was a story"  # 8 words: 3.2 s of audio
    guard = GatewaySection(barge_in_min_ms=500)
    async with running_session(guard, transcripts=[story, ""]) as h:
        await barge_in(h, 0.5, tone(320))  # long enough to be speech, too short to interrupt
        await h.say(silence(900))
        done = await h.wait_for("response.done")
    assert h.bus.cancelled == [] and h.of_type("output_audio.clear") == []
    assert done["status"] == "completed" and done["text"] == story
    assert h.audio_bytes() == 2 * 16000 * 3200 // 1000
    assert metrics.FALSE_INTERRUPTIONS._value.get() == before + 1


@on_virtual_time
async def test_speech_without_agent_audio_cancels_nothing() -> None:
    async with running_session(transcripts=["one", "two"], tts_first_s=5.0) as h:
        await h.say(silence(200), tone(600), silence(900))
        await h.wait_for("response.created")
        await h.say(tone(600), silence(900))  # speaks again before any audio played
        await h.wait_for("response.created", 2)
    first = h.of_type("response.done")[0]
    # the new turn's response replaces the silent one: cancelled with nothing heard
    assert first["status"] == "cancelled" and first["text"] == ""
    assert h.of_type("output_audio.clear") == []


def holding() -> TrailingWordHeuristic:
    """The end-of-turn policy that holds on 700 ms after a trailing "and", "the"..."""
    return TrailingWordHeuristic(GatewaySection(end_of_turn_hold_ms=700))


async def one_turn_under_hold(transcript: str) -> Harness:
    """A short utterance, heard as `transcript`, until its response starts."""
    async with running_session(end_of_turn=holding(), transcripts=[transcript]) as h:
        await h.say(silence(200), tone(600), silence(800))
        await h.wait_for("response.created")
    return h


@on_virtual_time
async def test_end_of_turn_hold_joins_a_paused_sentence() -> None:
    async with running_session(end_of_turn=holding(), transcripts=["go to the", "station"]) as h:
        await h.say(silence(200), tone(800), silence(800))
        await h.wait_for("transcript.final")
        await h.say(silence(100), tone(600), silence(900))  # goes on inside the hold
        await h.wait_for("response.done")
    assert len(h.of_type("transcript.final")) == 2
    assert len(h.of_type("response.created")) == 1
    assert h.of_type("response.done")[0]["text"] == "go to the station"
    assert history(h) == [("user", "go to the station"), ("agent", "go to the station")]


@on_virtual_time
async def test_end_of_turn_hold_runs_out() -> None:
    h = await one_turn_under_hold("bread and")
    held = h.time_of("response.created") - h.time_of("transcript.final")
    assert held == pytest.approx(0.7)


@on_virtual_time
async def test_a_failed_transcript_releases_the_hold_and_its_timer() -> None:
    expired = metrics.TURN_HOLDS.labels("expired")
    before = expired._value.get()
    async with running_session(end_of_turn=holding(), transcripts=["bread and"]) as h:
        await h.say(silence(200), tone(600), silence(800))
        await h.wait_for("transcript.final")
        h.bus.answer_asr = False
        await h.say(tone(600), silence(700))  # the user goes on inside the hold...
        (_, job, _) = h.bus.asr_jobs[-1]
        assert (
            job.mode == "final"
            and job.utterance_id == h.of_type("speech.started")[1]["utterance_id"]
        )
        h.session.deliver(job.failed("asr_unavailable", "m"), None)  # ...and its ASR fails
        await h.wait_for("response.created")
        await h.say(silence(1000))  # past the end of the hold
    assert h.time_of("response.created") == pytest.approx(h.time_of("error"))
    assert expired._value.get() == before  # the released hold's timer never fires


@on_virtual_time
async def test_no_hold_after_a_complete_sentence() -> None:
    h = await one_turn_under_hold("bread please")
    assert h.time_of("response.created") == pytest.approx(h.time_of("transcript.final"))


class FailingAgent:
    name = "failing"

    async def respond(
        self, history: list[Turn], instructions: str | None = None
    ) -> AsyncIterator[str]:
        yield "Let me"
        raise AgentFailed("the LLM timed out")


@on_virtual_time
async def test_agent_failure_costs_one_error_and_the_session_goes_on() -> None:
    agents = {"echo": FailingAgent}
    async with running_session(agents=agents, transcripts=["hi"]) as h:  # type: ignore[arg-type]
        await h.say(silence(200), tone(600), silence(900))
        done = await h.wait_for("response.done")
        await h.send({"type": "response.create", "text": "Still here."})
        second = await h.wait_for("response.done", 2)
    error = h.of_type("error")[0]
    assert error["code"] == "agent_failed" and error["fatal"] is False
    assert done["status"] == "completed" and done["text"] == "Let me"  # what was said is kept
    assert second["status"] == "completed" and second["text"] == "Still here."


@on_virtual_time
async def test_asr_timeout_is_reported_and_a_late_transcript_dropped() -> None:
    async with running_session(answer_asr=False) as h:
        await h.say(silence(200), tone(600), silence(900))
        error = await h.wait_for("error")
        stopped = h.time_of("speech.stopped")
        _, job, _ = next(j for j in h.bus.asr_jobs if j[1].mode == "final")
        h.bus._asr_result(job, "too late")
        await h.say(silence(200))
    assert error["code"] == "asr_unavailable"
    assert h.time_of("error") - stopped == pytest.approx(GatewaySection().asr_timeout_s)
    assert h.of_type("transcript.final") == [] and h.of_type("response.created") == []


@on_virtual_time
async def test_tts_silence_fails_the_response_in_time() -> None:
    async with running_session(transcripts=["hi"], tts_first_s=100.0) as h:
        await h.say(silence(200), tone(600), silence(900))
        done = await h.wait_for("response.done")
    assert h.of_type("error")[0]["code"] == "tts_unavailable"
    assert done["status"] == "failed"
    waited = h.time_of("response.done") - h.time_of("response.created")
    assert waited == pytest.approx(GatewaySection().tts_timeout_s, abs=0.05)


@on_virtual_time
async def test_thirty_seconds_of_speech_is_split() -> None:
    async with running_session(transcripts=["first", "second"], tts_ms_per_word=40) as h:
        await h.say(silence(200), tone(31_000), silence(900), frame_ms=100)
        await h.wait_for("transcript.final", 2)
    finals = [pcm for _, job, pcm in h.bus.asr_jobs if job.mode == "final"]
    assert len(finals) == 2 and pcm_ms(finals[0]) == pytest.approx(30_000, abs=40)
    assert len(h.of_type("transcript.final")) == 2


@on_virtual_time
async def test_session_voice_style_travels_with_every_tts_job() -> None:
    style = {"exaggeration": 1.2, "cfg_weight": 0.3, "temperature": 0.5}
    async with running_session() as h:
        await h.send({"type": "session.update", "session": {"tts": style}})
        updated = await h.wait_for("session.updated")
        await h.send({"type": "response.create", "text": "One. Two, three four five six seven."})
        await h.wait_for("response.done")
    assert updated["session"]["tts"] == style
    jobs = [job for _, job in h.bus.tts_jobs]
    assert len(jobs) >= 2
    assert all((j.exaggeration, j.cfg_weight, j.temperature) == (1.2, 0.3, 0.5) for j in jobs)


@on_virtual_time
async def test_the_hold_is_for_english_words_only() -> None:
    """ "bread and" holds the turn in English; in German the trailing-word rule does not
    judge it, and the transcript says which language was heard."""
    async with running_session(
        end_of_turn=holding(), transcripts=["bread and"], language="de"
    ) as h:
        await h.say(silence(200), tone(600), silence(800))
        await h.wait_for("response.created")
    final = h.of_type("transcript.final")[0]
    assert final["language"] == "de"
    assert h.time_of("response.created") == pytest.approx(h.time_of("transcript.final"))


@on_virtual_time
async def test_two_answers_begun_at_once_leave_no_reply_behind() -> None:
    """A transcript (the inbox task) and the client's `response.create` (the input loop)
    both start an answer while cancelling the old one takes a Redis round trip: the later
    one replaces the earlier, which is cancelled, never left playing where no
    `response.cancel` reaches it (it failed 15 s later with tts_unavailable)."""
    long_text = " ".join(["This sentence is long enough to keep the speaker busy."] * 6)
    settings = GatewaySection(speculative_asr=False)
    async with running_session(settings, transcripts=["hi"], cancel_delay_s=0.005) as h:
        await h.send({"type": "response.create", "text": long_text})
        while len(h.socket.audio) < 5:
            await h.say(silence(20))
        speaking = asyncio.create_task(h.say(tone(200), silence(1500)))  # too short to barge in
        await h.wait_for("transcript.final")
        await h.send({"type": "response.create", "text": "second answer here"})
        await speaking
        await h.send({"type": "response.cancel"})
        cancelled_at = h.loop.time()
        await h.say(silence(3000))
        await asyncio.sleep(30)
        created = [e["response_id"] for e in h.of_type("response.created")]
        ended = {e["response_id"]: e["status"] for e in h.of_type("response.done")}
        assert set(created) == set(ended), (created, ended)
        assert "failed" not in ended.values(), ended
        assert not h.of_type("error"), h.of_type("error")
        assert h.audio_bytes(since=cancelled_at + 0.3) == 0  # the cancel reached every reply


class _CountingMeter(AudioMeter):
    def __init__(self) -> None:
        super().__init__(None, "", None)
        self.bytes = 0

    async def add_pcm16(self, n_bytes: int, sample_rate: int) -> None:
        self.bytes += n_bytes


@on_virtual_time
async def test_a_refused_audio_frame_is_not_metered() -> None:
    """Empty, odd or over-long frames cost an error, not the tenant's audio quota."""
    meter = _CountingMeter()
    async with running_session(meter=meter) as h:
        for frame in (b"", bytes(321)):
            await h.socket.incoming.put({"type": "websocket.receive", "bytes": frame})
            await h.wait_for("error", count=1 if frame == b"" else 2)
        assert meter.bytes == 0
        await h.say(silence(20))
        assert meter.bytes == 640
