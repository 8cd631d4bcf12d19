"""Text for the ear: what the gateway sends to TTS instead of the model's written text."""

from __future__ import annotations

import pytest

from services.gateway.speech import spoken


@pytest.mark.parametrize(
    ("written", "said"),
    [
        ("It is 21 degrees.", "It is twenty-one degrees."),
        ("It costs $4.50.", "It costs four dollars fifty cents."),
        ("It costs $1.", "It costs one dollar."),
        ("€20 and £5.01", "twenty euros and five pounds one penny"),
        ("Growth was 12.5%.", "Growth was twelve point five percent."),
        ("Meet at 3:30 or 7:00.", "Meet at three thirty or seven o'clock."),
        ("Call at 10:05", "Call at ten oh five"),
        ("The 2nd of May 2024.", "The second of May twenty twenty-four."),
        ("1,234 people", "one thousand two hundred and thirty-four people"),
        ("temp -5", "temp minus five"),
        ("5 km/h and 21°C", "five kilometers per hour and twenty-one degrees Celsius"),
        ("A & B", "A and B"),
        ("It is #1.", "It is number one."),
        ("Visit https://www.example.com/docs?q=1 now", "Visit example dot com now"),
        ("Mail bob@example.org", "Mail bob at example dot org"),
        ("See [the docs](https://x.io/a).", "See the docs."),
        ("**Bold** and `code`", "Bold and code"),
        ("## Steps\n- one\n- two", "Steps\none\ntwo"),
        ("Version 3.57.0", "Version 3.57.0"),  # espeak reads versions digit by digit
        ("Call 555-1234", "Call 555-1234"),  # and codes
        ("Dr. Smith", "Dr. Smith"),  # espeak says "doctor"
    ],
)
def test_english(written: str, said: str) -> None:
    assert spoken(written, "en") == said


def test_numbers_in_the_session_language_and_symbols_left_alone_elsewhere() -> None:
    assert spoken("Es ist 21 Uhr.", "de") == "Es ist einundzwanzig Uhr."
    assert spoken("21 €", "fr-FR") == "vingt et un €"
    assert spoken("21 degrees", "xx") == "21 degrees"  # a language num2words lacks: untouched
    assert spoken("It is 21 degrees.", None) == "It is twenty-one degrees."  # detected: English
