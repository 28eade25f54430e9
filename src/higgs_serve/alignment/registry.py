"""Which aligner reads which language, chosen once per request before any audio is made.

`language` is the request's, as server/peer_fields.py normalises it: an English language name
(peer_fields.LANGUAGES' values) or "auto". An aligner is named here and built where it runs (a
worker process builds its own: alignment/worker.py), so the choice travels as a string.

"auto": Higgs-Audio V3 infers the language from the text, and so does this choice. With one
aligner (English, Latin script) that means: text whose letters are at least LATIN_SHARE Latin
script is aligned as English (docs/api.md#word-timestamps promises it: German, French, ...
written in Latin letters are aligned with the English model, their times rough); other text is
refused with a message asking for a `language`. Latin script is Unicode's: ASCII letters and
the Latin-1 and Latin Extended ones (ß, ä, ø, ł, œ, ...), whatever their accents. Where the text
is not known yet (a WebSocket session's config), "auto" picks the English aligner.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable

from higgs_serve.alignment.aligner import Aligner
from higgs_serve.errors import InvalidRequestError

AUTO = "auto"
LATIN_SHARE = 0.9


def _pocketsphinx() -> Aligner:
    from higgs_serve.alignment.pocketsphinx_aligner import PocketsphinxAligner

    return PocketsphinxAligner()


# aligner name -> (languages it reads, factory)
ALIGNERS: dict[str, tuple[frozenset[str], Callable[[], Aligner]]] = {
    "pocketsphinx-en": (frozenset({"English"}), _pocketsphinx),
}


def supported_languages() -> list[str]:
    return sorted({language for languages, _ in ALIGNERS.values() for language in languages})


def aligner_for(language: str, text: str | None = None) -> str:
    """The name of the aligner for `language` ("auto": see module doc), or InvalidRequestError
    (param `language`, a 400) saying which languages have word timestamps."""
    if language == AUTO:
        if text is not None and not _mostly_latin(text):
            raise InvalidRequestError(
                f"word_timestamps: the text is not in Latin script (fewer than {LATIN_SHARE:.0%} "
                f"of its letters), and word timestamps are available for "
                f"{', '.join(supported_languages())} only: with language 'auto', text in Latin "
                "letters is aligned with the English model, text in other scripts is refused "
                "(leave word_timestamps out)", param="language")
        language = "English"
    for name, (languages, _) in ALIGNERS.items():
        if language in languages:
            return name
    raise InvalidRequestError(
        f"word_timestamps are not available for {language}: this server's aligner reads "
        f"{', '.join(supported_languages())} only (leave word_timestamps out, or send language "
        "'English' or 'auto' with English text)", param="language")


def build_aligner(name: str) -> Aligner:
    """A new aligner of that name (it may load a model: seconds of CPU, call once per worker)."""
    return ALIGNERS[name][1]()


def _mostly_latin(text: str) -> bool:
    letters = [c for c in text if c.isalpha()]
    return not letters or sum(_latin(c) for c in letters) >= LATIN_SHARE * len(letters)


def _latin(letter: str) -> bool:
    """A letter of the Latin script (Unicode names them all LATIN ...: a, ß, Ø, ł, ǆ, ...)."""
    return letter.isascii() or unicodedata.name(letter, "").startswith("LATIN ")
