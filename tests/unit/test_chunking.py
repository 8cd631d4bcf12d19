"""The agent text → TTS chunks cutter."""

from __future__ import annotations

from services.gateway.chunking import Chunker


def run(deltas: list[str], first_words: int = 6) -> list[str]:
    chunker = Chunker(first_chunk_words=first_words)
    chunks: list[str] = []
    for delta in deltas:
        chunks.extend(chunker.feed(delta))
    return chunks + chunker.flush()


def test_sentences_split_across_deltas() -> None:
    chunks = run(["Hello the", "re. How are", " you? Fine", "."])
    assert chunks == ["Hello there.", "How are you?", "Fine."]


def test_no_split_inside_numbers_or_without_space() -> None:
    assert run(["It costs 3.50 dollars. Ok."]) == ["It costs 3.50 dollars.", "Ok."]


def test_first_chunk_cut_at_clause_once_long_enough() -> None:
    text = "Well, as I was saying to my friend yesterday, the weather was lovely, truly lovely."
    chunks = run([word + " " for word in text.split()], first_words=6)
    assert chunks[0] == "Well, as I was saying to my friend yesterday,"
    # later chunks are cut at sentences only
    assert chunks[1:] == ["the weather was lovely, truly lovely."]


def test_a_first_sentence_with_no_comma_is_cut_before_a_phrase() -> None:
    chunker = Chunker(first_chunk_words=6)
    text = "Please call Stella and ask her to bring these things with her"
    streamed = [chunker.feed(word + " ") for word in text.split(" ")]
    # out as soon as "to" is whole: six words before it, and "and" came too early
    assert streamed[6] == ["Please call Stella and ask her"]
    assert [c for out in streamed for c in out] == ["Please call Stella and ask her"]
    assert chunker.flush() == ["to bring these things with her"]


def test_a_phrase_word_still_being_streamed_does_not_cut() -> None:
    chunker = Chunker(first_chunk_words=3)
    assert chunker.feed("One two three to") == []  # "to" may be "tomorrow"
    assert chunker.feed("morrow and more ") == ["One two three tomorrow"]


def test_only_the_first_chunk_is_cut_at_a_phrase() -> None:
    text = "Book a table for two people at eight. Then call a taxi to the station."
    chunks = run([word + " " for word in text.split()], first_words=3)
    assert chunks == [
        "Book a table",
        "for two people at eight.",
        "Then call a taxi to the station.",
    ]


def test_the_phrase_cut_can_be_turned_off_and_is_english_only() -> None:
    text = "Please call Stella and ask her to bring these things with her"
    assert Chunker(6, first_chunk_phrase=False).feed(text + " ") == []
    assert Chunker(6, language="de").feed("Bitte ruf Stella an und sag ihr to das ") == []


def test_a_whole_sentence_in_one_delta_is_not_cut() -> None:
    # an echo or a fast agent hands over the whole sentence: one TTS job, not two
    for text in (
        "Please call Stella and ask her to bring these things with her.",
        "Well, as I was saying to my friend yesterday, the weather was lovely.",
    ):
        chunker = Chunker(first_chunk_words=6)
        assert chunker.feed(text) == []
        assert chunker.flush() == [text]
    # the same words still streaming are cut as before
    streamed = Chunker(first_chunk_words=6)
    assert streamed.feed("Please call Stella and ask her to bring ") == [
        "Please call Stella and ask her"
    ]


def test_short_clause_is_not_cut() -> None:
    assert run(["Yes, sure."]) == ["Yes, sure."]


def test_chunk_is_emitted_as_soon_as_complete() -> None:
    chunker = Chunker()
    assert chunker.feed("First sentence.") == []  # no following space yet: may continue
    assert chunker.feed(" Second") == ["First sentence."]
    assert chunker.flush() == ["Second"]


def test_overlong_text_without_punctuation_is_cut_at_a_space() -> None:
    chunker = Chunker(max_chars=20)
    chunks = chunker.feed("word " * 10) + chunker.flush()
    assert all(len(c) <= 20 for c in chunks)
    assert " ".join(chunks).split() == ["word"] * 10


def test_empty_and_whitespace() -> None:
    assert run(["", "   "]) == []


def test_abbreviations_do_not_end_a_sentence() -> None:
    text = "Dr. Smith met Mr. J. R. Jones at 3 p.m. today. They spoke, e.g. about the U.S. economy."
    assert run([text], first_words=100) == [
        "Dr. Smith met Mr. J. R. Jones at 3 p.m. today.",
        "They spoke, e.g. about the U.S. economy.",
    ]


def test_a_streamed_abbreviation_waits_for_what_follows() -> None:
    chunker = Chunker(first_chunk_words=100)
    assert chunker.feed("Ask Dr. ") == []  # "Dr. " may go on
    assert chunker.feed("Smith. ") == []
    assert chunker.feed("Then") == ["Ask Dr. Smith."]


def test_list_numbers_stay_with_their_item() -> None:
    text = "Here is how:\n1. Preheat the oven. 2. Mix the flour. Step 3. Bake."
    chunks = run([text], first_words=100)
    assert "1." not in chunks and "2." not in chunks and "Step 3." not in chunks
    assert chunks[-1] == "Step 3. Bake."
    assert any(c.endswith("1. Preheat the oven.") for c in chunks)


def test_decimals_money_and_urls_are_not_cut() -> None:
    text = "Pi is 3.14159 and it costs $4.50 at example.com/a.b today. Next."
    assert run([text], first_words=100) == [
        "Pi is 3.14159 and it costs $4.50 at example.com/a.b today.",
        "Next.",
    ]


def test_a_number_then_a_new_sentence_is_cut() -> None:
    assert run(["I paid 4. Then I left."], first_words=100) == ["I paid 4.", "Then I left."]


def test_other_languages_have_their_own_rules() -> None:
    chunker = Chunker(first_chunk_words=100, language="de-DE")
    chunks = chunker.feed("Das kostet z. B. zehn Euro. Danach") + chunker.flush()
    assert chunks == ["Das kostet z. B. zehn Euro.", "Danach"]
