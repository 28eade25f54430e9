"""What an English speaker says for one written word, as lower-case dictionary words.

`spoken_tokens("$5.25,")` -> ["five", "dollars", "twenty", "five", "cents"]: the English
aligner looks these up in its pronunciation dictionary, then gives the user's word the span from
its first token's start to its last token's end. Numbers are read by num2words (cardinals,
ordinals "21st", decimals, years, amounts of money in the currencies it knows); accents are
folded by Unicode decomposition (café -> cafe); the few symbols a reader voices (% & + @ =) get
their word; other punctuation is silent. A word that says nothing (a dash, an emoji) gets no
tokens: the aligner gives it an empty span where it stands.

Numbers longer than MAX_NUMBER_DIGITS digits are read digit by digit. Four-digit numbers from 1100 to 2099 (not 2000-2009) are read as years ("nineteen eighty-four"),
the reading a TTS model gives a bare four-digit number in running text most often; any other
number is a cardinal. A mismatch costs little: the aligner still finds the word's edges, only
its inside is modelled less well.
"""

from __future__ import annotations

import re
import unicodedata
from decimal import Decimal, InvalidOperation

from num2words import CONVERTER_CLASSES, num2words

# Symbols read aloud, and currency signs (their ISO code, for num2words' currency names).
SYMBOL_WORDS = {"%": "percent", "&": "and", "+": "plus", "@": "at", "=": "equals"}
CURRENCY_SIGNS = {"$": "USD", "€": "EUR", "£": "GBP"}
# Longer numbers are read digit by digit (num2words' largest names end at 10**36, and nobody
# reads a 16-digit number as a quantity).
MAX_NUMBER_DIGITS = 15

# One piece of a written word: a currency sign and number, a number (ordinal suffix allowed),
# a run of letters (inner apostrophes kept: don't, o'clock), or one symbol.
_PIECE = re.compile(
    r"(?P<money>[$€£])(?P<amount>\d[\d,]*(?:\.\d+)?)"
    r"|(?P<number>\d[\d,]*(?:\.\d+)?)(?P<ordinal>st|nd|rd|th)?"
    r"|(?P<letters>[a-z]+(?:'[a-z]+)*)"
    r"|(?P<symbol>[%&+@=])")
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)*")


# Latin letters that carry no accent to drop, written as an English reader would sound them out
# ("Straße" -> "strasse"); NFKD leaves them whole.
_LATIN_LETTERS = str.maketrans({"ß": "ss", "æ": "ae", "œ": "oe", "ø": "o", "ł": "l", "đ": "d",
                                "ð": "d", "þ": "th", "ı": "i", "ŋ": "ng", "ħ": "h", "ŧ": "t"})


def fold(word: str) -> str:
    """Lower case, accents removed (NFKD, combining marks dropped), the Latin letters without a
    decomposition spelled in ASCII (ß -> ss), curly apostrophes straight."""
    decomposed = unicodedata.normalize("NFKD", word.replace("\u2019", "'"))
    return "".join(c for c in decomposed if not unicodedata.combining(c)).lower().translate(_LATIN_LETTERS)


def spoken_tokens(word: str) -> list[str]:
    """The dictionary words a reader says for one whitespace-free written word (maybe none)."""
    tokens: list[str] = []
    for piece in _PIECE.finditer(fold(word)):
        if piece["money"] or piece["number"]:
            tokens += _words(_read_number(piece))
        elif piece["letters"]:
            tokens.append(piece["letters"])
        else:
            tokens.append(SYMBOL_WORDS[piece["symbol"]])
    return tokens


def _read_number(piece: re.Match) -> str:
    try:
        if piece["money"]:
            return _money(piece["amount"], CURRENCY_SIGNS[piece["money"]])
        return _number(piece["number"], piece["ordinal"])
    except (ArithmeticError, NotImplementedError, ValueError):  # num2words' limits: digit by digit
        return " ".join(num2words(int(d), lang="en") for d in piece[0] if d.isdigit())


def _words(spoken: str) -> list[str]:
    return _WORD.findall(spoken.lower())


def _value(digits: str) -> Decimal | None:
    try:
        return Decimal(digits.replace(",", ""))
    except InvalidOperation:
        return None


def _number(digits: str, ordinal: str | None) -> str:
    value = _value(digits.rstrip(".,"))
    if value is None:
        return ""
    if len(str(int(value))) > MAX_NUMBER_DIGITS:  # an id or a code: read digit by digit
        return " ".join(num2words(int(d), lang="en") for d in digits if d.isdigit())
    if ordinal and value == value.to_integral_value():
        return num2words(int(value), lang="en", to="ordinal")
    if "," not in digits and "." not in digits and 1100 <= value <= 2099 and not 2000 <= value <= 2009:
        return num2words(int(value), lang="en", to="year")
    return num2words(value, lang="en")


def _money(digits: str, currency: str) -> str:
    """'5' USD -> 'five dollars'; '5.25' -> 'five dollars, twenty-five cents' (num2words)."""
    value = _value(digits.rstrip(".,"))
    if value is None:
        return ""
    if len(str(int(value))) > MAX_NUMBER_DIGITS:
        return _number(digits, None)
    if value != value.to_integral_value():
        return num2words(value, lang="en", to="currency", currency=currency)
    (one, many), _ = CONVERTER_CLASSES["en"].CURRENCY_FORMS[currency]
    return f"{num2words(int(value), lang='en')} {one if value == 1 else many}"
