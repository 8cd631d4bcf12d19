"""Speculative transcription and pause policies (smart-turn) in the session, on virtual time.

The turn model is scripted (its answers and latency); the real Smart Turn model has its
own tests (tests/unit/test_smart_turn.py) and the turn-taking benchmark.
"""

from __future__ import annotations

import asyncio

import pytest

from services.common.audio.pcm import AudioF32
from services.common.audio.vad import VadSettings
from services.gateway import metrics
from services.gateway.settings import GatewaySection
from services.gateway.turn_end import Heard, SilenceOnly, SmartTurn, Transcript
from tests.component.session_harness import Harness, on_virtual_time, running_session, silence, tone

PAUSE_S = VadSettings().pause_ms / 1000  # the speculative transcript starts
FIRST_ASK_S = GatewaySection().end_of_turn_first_ask_ms / 1000  # the model is first asked
RECHECK_S = GatewaySection().end_of_turn_recheck_ms / 1000  # and again while silence lasts
WINDOW_S = 512 / 16000


def count(outcome: str) -> float:
    return float(metrics.SPECULATIVE_ASR.labels(outcome)._value.get())


def final_jobs(h: Harness) -> list[tuple[float, str]]:
    return [(t, job.job_id) for t, job, _ in h.bus.asr_jobs if job.mode == "final"]


class ScriptedTurnModel(SilenceOnly):
    """A pause policy that answers from a script after `delay_s` (then: incomplete)."""

    name = "scripted"
    decides_at_pause = True

    def __init__(self, *answers: bool, delay_s: float = 0.05) -> None:
        super().__init__(GatewaySection())
        self.answers = list(answers)
        self.delay_s = delay_s
        self.asked: list[tuple[float, int]] = []
        self.transcripts: list[Transcript] = []

    async def turn_complete(
        self, audio: AudioF32, transcript: Transcript, silence_ms: int = 0
    ) -> bool:
        self.asked.append((asyncio.get_running_loop().time(), audio.size))
        self.transcripts.append(transcript)
        await asyncio.sleep(self.delay_s)
        return self.answers.pop(0) if self.answers else False


# ---------------------------------------------------------------- speculation


@on_virtual_time
async def test_a_speculation_the_user_talks_over_is_wasted_and_never_shown() -> None:
    wasted, used = count("wasted"), count("used")
    async with running_session(transcripts=["go to the station"]) as h:
        await h.say(silence(200), tone(800), silence(300), tone(600), silence(800))
        await h.wait_for("response.done")
    (first, _), (second, _) = final_jobs(h)  # one per pause; the second was kept
    assert second - first == pytest.approx(0.3 + 0.6, abs=2 * WINDOW_S)
    assert [e["text"] for e in h.of_type("transcript.final")] == ["go to the station"]
    assert (count("wasted") - wasted, count("used") - used) == (1, 1)
    assert h.time_of("transcript.final") == pytest.approx(h.time_of("speech.stopped"))


@on_virtual_time
async def test_a_late_result_of_a_wasted_speculation_is_dropped() -> None:
    stale = metrics.STALE_DROPPED.labels("asr_result")
    before = stale._value.get()
    async with running_session(transcripts=["go on"], asr_delay_s=1.0) as h:
        await h.say(silence(200), tone(800), silence(300), tone(600), silence(1200))
        await h.wait_for("response.done")
    assert len(final_jobs(h)) == 2
    assert [e["text"] for e in h.of_type("transcript.final")] == ["go on"]
    assert stale._value.get() - before == 1  # the first pause's transcript, after the second
    # the kept speculation was sent 100 ms into the silence: 500 ms of its 1 s were hidden
    assert h.time_of("transcript.final") - h.time_of("speech.stopped") == pytest.approx(
        1.0 - (0.6 - PAUSE_S), abs=2 * WINDOW_S
    )


@on_virtual_time
async def test_without_speculation_the_audio_goes_at_the_end_of_the_turn() -> None:
    settings = GatewaySection(speculative_asr=False)
    async with running_session(settings=settings, transcripts=["hello"]) as h:
        await h.say(silence(200), tone(800), silence(800))
        await h.wait_for("response.done")
    ((sent, _),) = final_jobs(h)
    assert sent == pytest.approx(h.time_of("speech.stopped"))
    assert h.time_of("transcript.final") == pytest.approx(sent + h.bus.asr_delay_s)


@on_virtual_time
async def test_a_failed_speculation_is_sent_again_at_the_end() -> None:
    async with running_session(transcripts=["hello"], answer_asr=False) as h:
        await h.say(silence(200), tone(800), silence(300))
        (_, job, _) = h.bus.asr_jobs[-1]
        h.session.deliver(job.failed("capacity", "busy"), None)
        h.bus.answer_asr = True
        await h.say(silence(600))
        await h.wait_for("response.done")
    assert len(final_jobs(h)) == 2 and h.of_type("error") == []
    assert [e["text"] for e in h.of_type("transcript.final")] == ["hello"]


# ---------------------------------------------------------------- pause policies


@on_virtual_time
async def test_a_complete_turn_ends_at_the_pause() -> None:
    model = ScriptedTurnModel(True)
    settings = GatewaySection(end_of_turn_min_silence_ms=0)  # as soon as the model answers
    async with running_session(settings, end_of_turn=model, transcripts=["what time is it"]) as h:
        speech_end = await h.say(silence(200), tone(1000))
        await h.say(silence(800))
        await h.wait_for("response.done")
    ((asked_at, samples),) = model.asked
    assert asked_at - speech_end == pytest.approx(FIRST_ASK_S, abs=2 * WINDOW_S)
    # pre-roll, speech, and the silence so far
    assert samples / 16000 == pytest.approx(0.2 + 1.0 + FIRST_ASK_S, abs=2 * WINDOW_S)
    stopped = h.time_of("speech.stopped")
    assert stopped == pytest.approx(asked_at + model.delay_s)
    # the speculative transcript (sent at the pause, before the model was asked) is the final
    sent = speech_end + PAUSE_S
    assert h.time_of("transcript.final") == pytest.approx(
        max(stopped, sent + h.bus.asr_delay_s), abs=2 * WINDOW_S
    )
    assert len(final_jobs(h)) == 1


@on_virtual_time
async def test_a_turn_called_complete_early_ends_at_the_least_silence() -> None:
    model = ScriptedTurnModel(True)  # answers at FIRST_ASK_S + 50 ms of silence
    least_s = GatewaySection().end_of_turn_min_silence_ms / 1000
    assert FIRST_ASK_S + model.delay_s < least_s
    async with running_session(end_of_turn=model, transcripts=["what time is it"]) as h:
        speech_end = await h.say(silence(200), tone(1000))
        await h.say(silence(800))
        await h.wait_for("response.done")
    assert len(model.asked) == 1  # not asked again while it waits
    # no sooner than the least silence (the VAD's silence starts at or after the speech's
    # end), and at the first frame that reaches it
    assert least_s <= h.time_of("speech.stopped") - speech_end <= least_s + WINDOW_S
    assert len(final_jobs(h)) == 1  # the speculation is still the final


@on_virtual_time
async def test_speech_before_the_least_silence_keeps_a_turn_called_complete_open() -> None:
    model = ScriptedTurnModel(True, True)  # "complete" at both pauses
    least_s = GatewaySection().end_of_turn_min_silence_ms / 1000
    gap_ms = round(1000 * (FIRST_ASK_S + model.delay_s + least_s) / 2)  # between the two
    async with running_session(end_of_turn=model, transcripts=["go to the station"]) as h:
        await h.say(silence(200), tone(800), silence(gap_ms), tone(600), silence(800))
        await h.wait_for("response.done")
    assert len(model.asked) == 2
    assert len(h.of_type("speech.started")) == len(h.of_type("speech.stopped")) == 1
    assert [e["text"] for e in h.of_type("transcript.final")] == ["go to the station"]


@on_virtual_time
async def test_a_stream_that_stops_inside_the_least_silence_is_answered_on_the_clock() -> None:
    model = ScriptedTurnModel(True)
    least_s = GatewaySection().end_of_turn_min_silence_ms / 1000
    async with running_session(end_of_turn=model, transcripts=["what time is it"]) as h:
        speech_end = await h.say(silence(200), tone(1000))
        await h.say(silence(180))  # then nothing more
        await h.wait_for("response.done")
    assert len(model.asked) == 1
    stopped = h.time_of("speech.stopped") - speech_end
    assert least_s - WINDOW_S <= stopped <= least_s + WINDOW_S


@on_virtual_time
async def test_the_policy_gets_the_speculative_words_and_the_asrs_scores() -> None:
    model = ScriptedTurnModel(False, True, delay_s=0.2)
    options = {"transcripts": ["a recipe for it"], "last_word_logprob": -0.81, "avg_logprob": -0.4}
    async with running_session(end_of_turn=model, **options) as h:
        await h.say(silence(200), tone(1000), silence(800))
        await h.wait_for("response.done")
    first, second = model.transcripts
    assert first is second  # every ask of one pause shares the speculation's future
    assert first.result() == Heard("a recipe for it", last_word_logprob=-0.81, avg_logprob=-0.4)


@on_virtual_time
async def test_the_policy_hears_what_the_utterances_previous_pause_heard() -> None:
    model = ScriptedTurnModel()  # incomplete: only the fallback ends the turn
    async with running_session(end_of_turn=model, transcripts=["can you tell me"]) as h:
        await h.say(silence(200), tone(800), silence(500), tone(300), silence(600))
    first, *_, last = (t.result() for t in model.transcripts)
    assert first == Heard("can you tell me")  # the utterance's first pause
    assert last == Heard("can you tell me", before="can you tell me")


@on_virtual_time
async def test_speech_that_added_no_words_holds_the_turn_until_the_fallback() -> None:
    """A filler after a pause ("Can you tell me, um,"): the same words at both pauses, so
    smart-turn with the no-new-words rule (off by default) waits for the fallback however
    sure its model is."""
    settings = GatewaySection(
        end_of_turn_fallback_ms=1500, end_of_turn_no_new_words=True, end_of_turn_unsure_ms=900
    )
    policy = SmartTurn(settings)
    policy.batcher = SureAfter(1.7)  # type: ignore[assignment]
    async with running_session(settings, end_of_turn=policy, transcripts=["tell me"]) as h:
        await h.say(silence(200), tone(800), silence(500))
        assert h.of_type("speech.stopped") == []  # the model was unsure at the first pause
        speech_end = await h.say(tone(300))
        await h.say(silence(2000))
        await h.wait_for("response.done")
    stopped = h.time_of("speech.stopped")
    assert stopped - speech_end == pytest.approx(1.5, abs=3 * WINDOW_S)


class SureAfter:
    """Stands in for Smart Turn's batcher: audio longer than `seconds` is complete."""

    def __init__(self, seconds: float) -> None:
        self.samples = seconds * 16000

    async def probability(self, audio: AudioF32) -> float:
        return 0.99 if audio.size > self.samples else 0.1


@on_virtual_time
async def test_an_incomplete_turn_is_asked_again_as_the_silence_grows() -> None:
    model = ScriptedTurnModel(False, False, True)
    async with running_session(end_of_turn=model, transcripts=["book a table for"]) as h:
        speech_end = await h.say(silence(200), tone(1000))
        await h.say(silence(1500))
        await h.wait_for("response.done")
    times = [t - speech_end for t, _ in model.asked]
    grid = [FIRST_ASK_S + k * RECHECK_S for k in range(3)]
    assert times == pytest.approx(grid, abs=2 * WINDOW_S)
    assert [n for _, n in model.asked] == sorted(n for _, n in model.asked)  # more silence
    assert h.time_of("speech.stopped") == pytest.approx(model.asked[-1][0] + model.delay_s)
    assert len(final_jobs(h)) == 1  # one pause, one speculation, kept


@on_virtual_time
async def test_a_turn_the_model_never_calls_complete_ends_at_the_fallback() -> None:
    model = ScriptedTurnModel()
    settings = GatewaySection(end_of_turn_fallback_ms=1500)
    async with running_session(settings, end_of_turn=model, transcripts=["um"]) as h:
        speech_end = await h.say(silence(200), tone(800))
        await h.say(silence(2000))
        await h.wait_for("response.done")
    assert h.time_of("speech.stopped") - speech_end == pytest.approx(1.5, abs=2 * WINDOW_S)
    times = [t - speech_end for t, _ in model.asked]  # first ask, then every recheck
    asks = 1 + int((1.5 - FIRST_ASK_S) / RECHECK_S)
    assert len(times) in (asks, asks + 1)
    assert times == pytest.approx(
        [FIRST_ASK_S + k * RECHECK_S for k in range(len(times))], abs=2 * WINDOW_S
    )


@on_virtual_time
async def test_the_user_going_on_keeps_the_turn_open() -> None:
    model = ScriptedTurnModel(False, True, delay_s=0.05)
    async with running_session(end_of_turn=model, transcripts=["go to the station"]) as h:
        await h.say(silence(200), tone(800), silence(250), tone(600), silence(600))
        await h.wait_for("response.done")
    assert len(h.of_type("speech.started")) == len(h.of_type("speech.stopped")) == 1
    assert [e["text"] for e in h.of_type("transcript.final")] == ["go to the station"]


@on_virtual_time
async def test_an_answer_that_comes_after_the_user_went_on_is_ignored() -> None:
    model = ScriptedTurnModel(True, True, delay_s=0.2)  # slower than the user
    async with running_session(end_of_turn=model, transcripts=["one two"]) as h:
        await h.say(silence(200), tone(800), silence(250), tone(600), silence(800))
        await h.wait_for("response.done")
    # asked at the first pause, but the user spoke again before the answer came
    assert len(h.of_type("speech.stopped")) == 1
    stopped = h.time_of("speech.stopped")
    assert stopped == pytest.approx(model.asked[1][0] + model.delay_s)


class FixedProbability:
    """Stands in for the Smart Turn model's batcher."""

    def __init__(self, probability: float) -> None:
        self.value = probability

    async def probability(self, audio: AudioF32) -> float:
        return self.value


def smart_turn(probability: float) -> SmartTurn:
    policy = SmartTurn(GatewaySection())
    policy.batcher = FixedProbability(probability)  # type: ignore[assignment]
    return policy


@on_virtual_time
async def test_smart_turn_ends_a_complete_turn_once_its_words_agree() -> None:
    async with running_session(end_of_turn=smart_turn(0.9), transcripts=["what time is it"]) as h:
        speech_end = await h.say(silence(200), tone(1000))
        await h.say(silence(800))
        await h.wait_for("response.done")
    # the decision waited for the speculative transcript (200 ms at the fake ASR)
    stopped = h.time_of("speech.stopped") - speech_end
    assert stopped == pytest.approx(PAUSE_S + h.bus.asr_delay_s, abs=2 * WINDOW_S)
    assert h.time_of("transcript.final") == pytest.approx(h.time_of("speech.stopped"))


@on_virtual_time
async def test_smart_turn_waits_when_the_words_end_mid_thought() -> None:
    settings = GatewaySection(end_of_turn_fallback_ms=1500)
    policy = smart_turn(0.9)
    async with running_session(settings, end_of_turn=policy, transcripts=["a table for"]) as h:
        speech_end = await h.say(silence(200), tone(1000))
        await h.say(silence(1800))
        await h.wait_for("response.done")
    assert h.time_of("speech.stopped") - speech_end == pytest.approx(1.5, abs=2 * WINDOW_S)


@on_virtual_time
async def test_smart_turn_without_speculation_trusts_the_model() -> None:
    settings = GatewaySection(speculative_asr=False)
    async with running_session(settings, end_of_turn=smart_turn(0.9), transcripts=["x"]) as h:
        speech_end = await h.say(silence(200), tone(1000))
        await h.say(silence(800))
        await h.wait_for("response.done")
    least_s = settings.end_of_turn_min_silence_ms / 1000
    assert h.time_of("speech.stopped") - speech_end == pytest.approx(
        max(FIRST_ASK_S, least_s), abs=2 * WINDOW_S
    )


@on_virtual_time
async def test_the_word_rules_leave_a_language_they_do_not_know_to_the_model() -> None:
    """ "a table for" ends mid-thought in English; heard as French, the words do not hold
    the turn: the model's "complete" ends it at the pause, as for any finished sentence."""
    settings = GatewaySection(end_of_turn_fallback_ms=1500)
    policy = smart_turn(0.9)
    async with running_session(
        settings, end_of_turn=policy, transcripts=["a table for"], language="fr"
    ) as h:
        speech_end = await h.say(silence(200), tone(1000))
        await h.say(silence(1800))
        await h.wait_for("response.done")
    stopped = h.time_of("speech.stopped") - speech_end
    assert stopped == pytest.approx(PAUSE_S + h.bus.asr_delay_s, abs=2 * WINDOW_S)
    assert h.of_type("transcript.final")[0]["language"] == "fr"
