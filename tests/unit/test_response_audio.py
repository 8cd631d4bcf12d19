"""Ordering, de-duplication and heard-text of a response's audio."""

from __future__ import annotations

from services.gateway.response import ResponseAudio


def drain(audio: ResponseAudio) -> list[bytes]:
    out = []
    while (piece := audio.next_audio()) is not None:
        out.append(piece)
    return out


def test_pieces_play_in_order_whatever_the_arrival_order() -> None:
    audio = ResponseAudio("r")
    audio.add_text("one.")
    audio.add_text("two.")
    audio.finish_text()
    audio.add_audio(1, 0, b"B0")  # the second chunk's audio arrives first
    assert drain(audio) == []
    audio.add_audio(0, 1, b"A1")
    assert drain(audio) == []
    audio.add_audio(0, 0, b"A0")
    assert drain(audio) == [b"A0", b"A1"]
    audio.finish_chunk(0, 2)
    assert drain(audio) == [b"B0"]
    assert not audio.complete
    audio.finish_chunk(1, 1)
    assert drain(audio) == []
    assert audio.complete


def test_repeated_pieces_are_dropped() -> None:
    audio = ResponseAudio("r")
    audio.add_text("one.")
    assert audio.add_audio(0, 0, b"A0")
    assert not audio.add_audio(0, 0, b"A0")  # repeat before playing
    assert drain(audio) == [b"A0"]
    assert not audio.add_audio(0, 0, b"A0")  # repeat after playing (a reclaimed job)
    assert not audio.add_audio(5, 0, b"X")  # unknown chunk
    assert drain(audio) == []


def test_failed_chunk_is_skipped() -> None:
    audio = ResponseAudio("r")
    audio.add_text("one.")
    audio.add_text("two.")
    audio.finish_text()
    audio.finish_chunk(0, 0, failed=True)
    audio.add_audio(1, 0, b"B0")
    audio.finish_chunk(1, 1)
    assert drain(audio) == [b"B0"]
    assert audio.complete and audio.any_failed


def test_heard_text_counts_whole_chunks_and_a_share_of_the_current() -> None:
    audio = ResponseAudio("r")
    audio.add_text("one two.")
    audio.add_text("three four five six.")
    audio.finish_text()
    audio.add_audio(0, 0, b"x" * 100)
    audio.finish_chunk(0, 1)
    audio.add_audio(1, 0, b"y" * 200)
    audio.finish_chunk(1, 1)
    drain(audio)
    assert audio.heard_text(0) == ""
    assert audio.heard_text(100) == "one two."
    assert audio.heard_text(200) == "one two. three four"
    assert audio.heard_text(300) == "one two. three four five six."
