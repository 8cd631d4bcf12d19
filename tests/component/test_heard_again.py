"""An utterance whose words its gateway never took (killed -9 between the end of the speech
and the transcript, or the link gone first) is heard again by the session's next
connection: each final ASR job's entry is noted as it goes, the record names the
utterances whose words were taken, and a resume reads the audio back from the entry.

A note superseded by more speech (the user went on after a pause) is withdrawn; notes land
in the order they were asked for."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import cast

from services.common.bus.messages import AsrJob
from services.gateway.agent import AGENTS, AgentOutput, Turn
from services.gateway.settings import GatewaySection
from services.gateway.store import SessionStore, Unheard
from tests.component.session_harness import (
    RecordingStore,
    on_virtual_time,
    running_session,
    scripted,
    silence,
    tone,
)


@on_virtual_time
async def test_an_utterance_is_noted_as_sent_and_named_taken_with_its_words() -> None:
    store = RecordingStore()
    async with running_session(
        transcripts=["hello there"], store=cast(SessionStore, store), locate=True
    ) as h:
        await h.say(silence(200), tone(900), silence(1000))
        await h.wait_for("response.done")
    utterance = h.of_type("transcript.final")[0]["utterance_id"]
    assert len(store.notes) == 2 and store.notes[0] is not None
    assert store.notes[1] is None  # withdrawn once its words were saved
    note = store.notes[0]
    assert (note.utterance_id, note.stream) == (utterance, "fake:asr:jobs")
    assert h.bus.entries[note.entry_id][0].utterance_id == utterance  # where its audio lies
    assert store.records[:2] == [
        ([], None, ()),  # a new session's record first (its first note): a resume finds it
        ([Turn("user", "hello there")], utterance, (utterance,)),
    ]


@on_virtual_time
async def test_a_pause_the_user_spoke_on_from_is_withdrawn() -> None:
    store = RecordingStore()
    async with running_session(
        transcripts=["hello there"], store=cast(SessionStore, store), locate=True
    ) as h:
        await h.say(silence(200), tone(900), silence(300), tone(600), silence(1000))
        await h.wait_for("response.done")
    first, went_on, second, taken = store.notes
    assert first is not None and second is not None and went_on is None and taken is None
    assert first.utterance_id == second.utterance_id and first.end_ms < second.end_ms


def _lost_entry(bus_entries: dict[str, tuple[AsrJob, bytes]]) -> Unheard:
    """A final ASR job another gateway process submitted for this session, then died."""
    job = AsrJob(
        job_id="asr_old",
        session_id="sess_test",
        utterance_id="utt_lost",
        reply_to="va:gw:dead:results",
    )
    bus_entries["7-0"] = (job, tone(900))
    return Unheard(
        utterance_id="utt_lost", stream="fake:asr:jobs", entry_id="7-0", start_ms=200, end_ms=1100
    )


@on_virtual_time
async def test_a_resume_hears_again_what_its_gateway_never_took_and_answers_it() -> None:
    store = RecordingStore()
    entries: dict[str, tuple[AsrJob, bytes]] = {}
    unheard = _lost_entry(entries)
    history = [Turn("user", "first"), Turn("agent", "first")]
    async with running_session(
        history=history,
        taken=("utt_first",),
        unheard=unheard,
        transcripts=["remember the door"],
        store=cast(SessionStore, store),
        entries=entries,
        locate=True,
    ) as h:
        done = await h.wait_for("response.done")
    final = h.of_type("transcript.final")[0]
    assert (final["utterance_id"], final["text"]) == ("utt_lost", "remember the door")
    assert [c["utterance_id"] for c in h.of_type("response.created")] == ["utt_lost"]
    assert (done["status"], done["text"]) == ("completed", "remember the door")
    _, job, pcm = h.bus.asr_jobs[0]
    assert (job.reply_to, job.utterance_id) == (h.bus.reply_to, "utt_lost")
    assert job.job_id != "asr_old" and pcm == entries["7-0"][1]
    assert store.records[0][1:] == ("utt_lost", ("utt_first", "utt_lost"))


@on_virtual_time
async def test_words_already_taken_are_not_heard_again() -> None:
    entries: dict[str, tuple[AsrJob, bytes]] = {}
    unheard = _lost_entry(entries)
    history = [Turn("user", "remember the door"), Turn("agent", "remember the door")]
    async with running_session(
        history=history, taken=("utt_lost",), unheard=unheard, entries=entries
    ) as h:
        await h.say(silence(3000))
    assert h.bus.asr_jobs == [] and h.of_type("response.created") == []


@on_virtual_time
async def test_later_words_heard_again_come_before_an_answer_owed_to_earlier_ones() -> None:
    entries: dict[str, tuple[AsrJob, bytes]] = {}
    unheard = _lost_entry(entries)
    async with running_session(
        history=[Turn("user", "what time is it")],
        owed="utt_first",
        taken=("utt_first",),
        unheard=unheard,
        transcripts=["never mind, what day is it"],
        entries=entries,
    ) as h:
        done = await h.wait_for("response.done")
        await h.say(silence(2000))
    assert [c["utterance_id"] for c in h.of_type("response.created")] == ["utt_lost"]
    assert done["text"] == "never mind, what day is it"
    assert h.session.history[-2:] == [
        Turn("user", "never mind, what day is it"),
        Turn("agent", "never mind, what day is it"),
    ]


@on_virtual_time
async def test_an_entry_of_another_sessions_words_is_never_heard_here() -> None:
    entries: dict[str, tuple[AsrJob, bytes]] = {}
    unheard = _lost_entry(entries)
    job, pcm = entries["7-0"]
    entries["7-0"] = (job.model_copy(update={"session_id": "sess_other"}), pcm)
    async with running_session(unheard=unheard, entries=entries) as h:
        await h.say(silence(3000))
    assert h.bus.asr_jobs == [] and h.of_type("transcript.final") == []


@on_virtual_time
async def test_an_entry_gone_from_its_stream_leaves_the_owed_answer() -> None:
    unheard = Unheard(
        utterance_id="utt_lost", stream="fake:asr:jobs", entry_id="9-0", start_ms=0, end_ms=900
    )
    async with running_session(
        history=[Turn("user", "what time is it")],
        owed="utt_first",
        taken=("utt_first",),
        unheard=unheard,
    ) as h:
        done = await h.wait_for("response.done")
    assert [c["utterance_id"] for c in h.of_type("response.created")] == ["utt_first"]
    assert done["text"] == "what time is it"


async def _thinks() -> AsyncIterator[AgentOutput]:
    await asyncio.sleep(10)  # an agent thinking (an LLM call, a tool)
    yield "It is noon."


@on_virtual_time
async def test_a_noise_heard_again_leaves_the_answer_owed_to_earlier_words() -> None:
    """Turn A taken, its answer under way; a cough (heard as nothing) while the agent
    thinks; the gateway dies. The next connection hears the cough again (nothing), then
    gives the answer A is owed."""
    store = RecordingStore()
    entries: dict[str, tuple[AsrJob, bytes]] = {}
    agents = {**AGENTS, "echo": scripted(_thinks)}
    async with running_session(
        agents=agents,
        transcripts=["what time is it", ""],
        store=cast(SessionStore, store),
        locate=True,
        entries=entries,
    ) as h:
        await h.say(silence(200), tone(900), silence(1000))
        await h.say(tone(300), silence(1500))
        history, owed, taken = store.records[-1]
        note = store.notes[-1]  # what Redis holds as the gateway dies
    assert owed is not None and note is not None and note.utterance_id not in taken
    async with running_session(
        agents=agents,
        history=history,
        owed=owed,
        taken=taken,
        unheard=note,
        transcripts=[""],
        entries=entries,
        locate=True,
    ) as again:
        await again.say(silence(20000))
    assert [c["utterance_id"] for c in again.of_type("response.created")] == [owed]
    assert len(again.bus.asr_jobs) == 1  # the cough, heard again


@on_virtual_time
async def test_words_the_client_cleared_are_not_heard_again() -> None:
    store = RecordingStore()
    async with running_session(
        transcripts=["delete all my files"], store=cast(SessionStore, store), locate=True
    ) as h:
        await h.say(silence(200), tone(900), silence(200))  # a pause: speculation, noted
        await h.send({"type": "input_audio.clear"})  # the client takes it back
        await h.say(silence(3000))
    assert h.of_type("response.created") == []
    assert store.notes[0] is not None and store.notes[-1] is None


@on_virtual_time
async def test_a_pause_in_the_next_utterance_keeps_the_note_of_one_still_unheard() -> None:
    """Without speculation: utterance A's job goes (noted), its transcript not back yet;
    the user speaks B, pauses and goes on: A's note stays."""
    store = RecordingStore()
    async with running_session(
        settings=GatewaySection(speculative_asr=False),
        transcripts=["first", "second"],
        store=cast(SessionStore, store),
        locate=True,
        asr_delay_s=3.0,
    ) as h:
        await h.say(silence(200), tone(900), silence(700))  # A ends: its job goes, noted
        await h.say(tone(500), silence(200), tone(500))  # B: a pause, then more
        assert h.of_type("transcript.final") == []
        assert [n and n.utterance_id for n in store.notes] == [
            h.of_type("speech.stopped")[0]["utterance_id"]
        ]
