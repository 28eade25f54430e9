"""alignment/: the word contract (one timing per whitespace word, tags removed, ordered, inside
the audio), English normalisation, the language choice, and PocketSphinx on real speech with
known word edges (tests/support/data)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from higgs_serve.alignment import aligner_for, build_aligner, user_words
from higgs_serve.alignment.english_text import spoken_tokens
from higgs_serve.errors import AlignmentError, InvalidRequestError
from support.aligned_speech import aligned_speech


@pytest.fixture(scope="module")
def aligner():
    return build_aligner("pocketsphinx-en")


def _check_contract(timings, words, duration_s):
    assert [t.word for t in timings] == words
    for before, after in zip(timings, timings[1:]):
        assert before.end_s <= after.start_s + 1e-9
    for t in timings:
        assert 0 <= t.start_s <= t.end_s <= duration_s


def test_user_words_drop_tags_and_split_on_whitespace():
    text = "<|emotion:happy|>Hello<|prosody:pause|>world,  it's\n$5 — ok <|sfx:cough|>"
    assert user_words(text) == ["Hello", "world,", "it's", "$5", "—", "ok"]
    assert user_words("<|emotion:sad|>  ") == []


@pytest.mark.parametrize("word, tokens", [
    ("Hello!", ["hello"]), ("don't", ["don't"]), ("Café", ["cafe"]), ("—", []),
    ("50%", ["fifty", "percent"]), ("21st", ["twenty", "first"]), ("3.5", ["three", "point", "five"]),
    ("1,000", ["one", "thousand"]), ("1984", ["nineteen", "eighty", "four"]),
    ("$1", ["one", "dollar"]), ("R&D", ["r", "and", "d"]), ("e-mail", ["e", "mail"]),
    ("1234567890123456", "one two three four five six seven eight nine zero one two three four five six".split()),
])
def test_spoken_tokens(word, tokens):
    assert spoken_tokens(word) == tokens


def test_language_choice():
    assert aligner_for("English") == "pocketsphinx-en"
    assert aligner_for("auto", "Hello there, café.") == "pocketsphinx-en"
    assert aligner_for("auto") == "pocketsphinx-en"  # text not known yet (a WebSocket config)
    with pytest.raises(InvalidRequestError, match="not available for French") as error:
        aligner_for("French", "Bonjour")
    assert error.value.param == "language"
    with pytest.raises(InvalidRequestError, match="not in Latin script"):
        aligner_for("auto", "你好，世界")


def test_latin_script_includes_its_accented_and_extended_letters():
    """`auto` reads German, Polish, Danish ... text as Latin script (aligned with the English
    model, as docs/api.md#word-timestamps says), and the letters NFKD cannot fold are spelled
    the way an English reader would sound them out."""
    for text in ("Straße Größe Fußball", "Łódź żółw", "Ærø øl", "Œuvre été"):
        assert aligner_for("auto", text) == "pocketsphinx-en", text
    assert [spoken_tokens(w) for w in "Straße Größe Fußball".split()] == [["strasse"], ["grosse"], ["fussball"]]
    assert spoken_tokens("Łódź") == ["lodz"] and spoken_tokens("Ærø") == ["aero"]
    with pytest.raises(InvalidRequestError, match="not in Latin script"):
        aligner_for("auto", "Straße Привет мир Москва")  # mostly Cyrillic
    with pytest.raises(InvalidRequestError, match="not available for German"):
        aligner_for("German", "Straße")


def test_real_speech_within_the_acceptance_error(aligner):
    speech = aligned_speech()
    words = user_words(speech.text)
    timings = aligner.align(speech.audio, speech.sample_rate_hz, words)
    _check_contract(timings, words, len(speech.audio) / speech.sample_rate_hz)
    errors = [abs(t.start_s - start) for t, (_, start, _) in zip(timings, speech.truth)]
    errors += [abs(t.end_s - end) for t, (_, _, end) in zip(timings, speech.truth)]
    assert np.mean(errors) <= 0.040 and max(errors) <= 0.150, errors


def test_unknown_words_and_silent_tokens_keep_the_contract(aligner):
    speech = aligned_speech()
    # "station" -> a word no dictionary has; a dash and a tag that say nothing
    text = speech.text.replace("station", "Zorblaxion —").replace("The ", "<|emotion:calm|>The ")
    words = user_words(text)
    timings = aligner.align(speech.audio, speech.sample_rate_hz, words)
    _check_contract(timings, words, len(speech.audio) / speech.sample_rate_hz)
    dash = timings[words.index("—")]
    assert dash.start_s == dash.end_s == timings[words.index("—") - 1].end_s
    # its neighbours stay put: "at" follows the unknown word where it truly starts
    at = words.index("at")
    assert abs(timings[at].start_s - speech.truth[at - 1][1]) <= 0.1


def test_no_words_and_too_short_audio(aligner):
    assert aligner.align(np.zeros(2400, np.float32), 24000, []) == []
    assert [t.end_s for t in aligner.align(np.zeros(2400, np.float32), 24000, ["—"])] == [0.0]
    with pytest.raises(AlignmentError):
        aligner.align(np.zeros(480, np.float32), 24000, "a sentence far too long for it".split())


def test_pocketsphinx_needs_no_portaudio():
    """pocketsphinx requires sounddevice, which fails to import without PortAudio (this box and
    CI have none): the aligner must never import it."""
    code = ("import sys, numpy as np\n"
            "from higgs_serve.alignment import build_aligner\n"
            "build_aligner('pocketsphinx-en').align(np.zeros(24000, np.float32), 24000, ['hello'])\n"
            "assert 'sounddevice' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
