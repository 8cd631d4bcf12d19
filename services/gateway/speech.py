"""Text as it should be said: what an LLM writes for the eye, rewritten for the ear.

Sent to TTS only (the client's text, and what the user heard, keep the model's words).
Piper reads numbers through espeak-ng, which says "21", "12.5%" and "1,234" well, but it
says "$4.50" as "dollar four point five zero", "**" as "asterisk asterisk", "km/h" as
"k m slash h" and spells URLs out; chatterbox reads digits and symbols as it can. So:
- markdown marks go (emphasis, headings, bullets, code ticks; a link keeps its text);
- a URL is said as its host ("example dot com"), an e-mail address with "at" and "dot";
- money, units and a few symbols become words (English sessions);
- numbers become words in the session's language (`num2words`, ~50 languages), years
  as years ("twenty twenty-four"), ordinals as ordinals, times as "three thirty".
"""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation

from num2words import CONVERTER_CLASSES, num2words

_LINK = re.compile(r"\[([^\]]+)\]\((?:https?://)?[^)\s]+\)")
_URL = re.compile(r"\b(?:https?://|www\.)([\w.-]+\.[a-z]{2,})(?:[/?#][^\s]*)?", re.IGNORECASE)
_EMAIL = re.compile(r"\b([\w.+-]+)@([\w-]+(?:\.[\w-]+)+)\b")
_MARKS = re.compile(r"(\*\*|__|\*|`+|~~)(?=\S)(.+?)(?<=\S)\1")
_LINE_MARK = re.compile(r"^\s*(?:#{1,6}\s+|[-*•+]\s+|>\s+)", re.MULTILINE)
_STRAY = re.compile(r"[*`|]+|#(?!\d)")
_MONEY = re.compile(r"([$€£¥])\s?(\d[\d,]*)(?:\.(\d{1,2}))?\b")
_CURRENCIES = {"$": ("dollar", "cent"), "€": ("euro", "cent"), "£": ("pound", "penny")}
_UNITS = {
    "km/h": "kilometers per hour",
    "m/s": "meters per second",
    "mph": "miles per hour",
    "°C": "degrees Celsius",
    "°F": "degrees Fahrenheit",
    "km": "kilometers",
    "kg": "kilograms",
    "cm": "centimeters",
    "mm": "millimeters",
    "ml": "milliliters",
    "kWh": "kilowatt hours",
    "%": "percent",
}
_UNIT = re.compile(
    r"(?<=\d)\s?("
    + "|".join(re.escape(u) for u in sorted(_UNITS, key=len, reverse=True))
    + r")(?![\w/])"
)
_SYMBOLS = [
    (re.compile(r"\s*(?:->|→)\s*"), " to "),
    (re.compile(r"\s&\s"), " and "),
    (re.compile(r"(?<=\s)~(?=\d)|≈\s?"), "about "),
    (re.compile(r"(?<=\d)\s?\+\s?(?=\d)"), " plus "),
    (re.compile(r"(?<=\d)\s?=\s?(?=\d)"), " equals "),
    (re.compile(r"(?<=\d)\s?×\s?(?=\d)"), " times "),
    (re.compile(r"#(?=\d)"), "number "),
]
_TIME = re.compile(r"\b([01]?\d|2[0-3]):([0-5]\d)\b")
_ORDINAL = re.compile(r"\b(\d+)(?:st|nd|rd|th)\b")
_YEAR = re.compile(r"(?<!\d-)\b(1[1-9]\d\d|20\d\d)\b(?![.,]\d|-\d)")
_NUMBER = re.compile(
    r"(?<![\w.])(?<!\d-)-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w.]*\d|-\d|,\d)"
)
"""A number (with thousands commas, a sign, decimals); not a version (3.57.0), nor part of
a phone number or code (555-1234), which the TTS reads as it does."""


def spoken(text: str, language: str | None = None) -> str:
    """`text` rewritten to be said (see the module's docstring)."""
    lang = _language(language)
    english = lang.startswith("en")
    text = _LINK.sub(r"\1", text)
    text = _EMAIL.sub(lambda m: f"{m[1]} at {_dotted(m[2])}" if english else m[0], text)
    text = _URL.sub(lambda m: _dotted(m[1].removeprefix("www.")) if english else m[1], text)
    text = _LINE_MARK.sub("", text)
    text = _MARKS.sub(r"\2", text)
    text = _STRAY.sub("", text)
    if english:
        text = _MONEY.sub(_money, text)
        text = _UNIT.sub(lambda m: " " + _UNITS[m[1]], text)
        for pattern, words in _SYMBOLS:
            text = pattern.sub(words, text)
        text = _TIME.sub(_time, text)
    if lang in CONVERTER_CLASSES:
        say = _numbers(lang)
        text = _ORDINAL.sub(lambda m: say(m[1], "ordinal"), text)
        text = _YEAR.sub(lambda m: say(m[1], "year"), text)
        text = _NUMBER.sub(lambda m: say(m[0], "cardinal"), text)
    return re.sub(r"[ \t]{2,}", " ", text).strip()


def _language(language: str | None) -> str:
    """num2words' name for a language tag ("en-US" → "en", "pt-BR" → "pt_BR")."""
    if not language:
        return "en"
    tag = language.replace("-", "_")
    if tag in CONVERTER_CLASSES:
        return tag
    return tag.split("_")[0].lower()


def _dotted(host: str) -> str:
    return " dot ".join(host.split("."))


def _money(match: re.Match[str]) -> str:
    symbol, whole, cents = match[1], match[2].replace(",", ""), match[3]
    unit, small = _CURRENCIES.get(symbol, ("yen", "sen"))
    words = f"{whole} {unit}{'' if whole == '1' or unit == 'yen' else 's'}"
    if cents and int(cents):
        value = int(cents.ljust(2, "0"))
        plural = "pence" if small == "penny" else "cents"
        words += f" {value} {small if value == 1 else plural}"
    return words


def _time(match: re.Match[str]) -> str:
    hour, minute = int(match[1]), int(match[2])
    if minute == 0:
        return f"{hour} o'clock"
    return f"{hour} oh {minute}" if minute < 10 else f"{hour} {minute}"


def _numbers(lang: str) -> Callable[[str, str], str]:
    def say(digits: str, kind: str) -> str:
        try:
            value = Decimal(digits.replace(",", ""))
            if kind == "cardinal" and value == value.to_integral_value() and "." not in digits:
                words = num2words(int(value), lang=lang)
            elif kind == "cardinal":
                words = num2words(value, lang=lang)
            else:
                words = num2words(int(value), lang=lang, to=kind)
        except (InvalidOperation, NotImplementedError, OverflowError, ValueError):
            return digits
        return str(words).replace(",", "")

    return say
