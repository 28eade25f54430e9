"""English forced alignment with PocketSphinx (the 5.1.1 wheel's bundled en-US acoustic model and
CMU pronouncing dictionary; nothing is downloaded).

Per call: the audio is resampled to 16 kHz (soxr) and converted once to int16
(audio/formats.py); each user word becomes its spoken tokens (english_text.py); the decoder is
given the tokens as an alignment grammar (optional silence between words) and decodes the
whole utterance; `seg()` returns each token's first and last 10 ms frame, and a user word spans
its first token's start to its last token's end.

Words the dictionary lacks: the bundled setup has no grapheme-to-phoneme model, so such a
token gets a pronunciation made of dictionary pieces: the word is split into the fewest
dictionary entries that spell it ("kokoro" -> "ko" "ko" "ro"; single letters cost more than
longer pieces, so they are the last resort), and the pieces' phones are joined. A word in
capitals of up to five letters not in the dictionary is spelled letter by letter ("GPU" ->
G P U), as TTS models read such acronyms. The pronunciation is rough, but the aligner needs
only the word's edges: docs/api.md#word-timestamps gives the measured error for such words.

A Decoder is not thread-safe and holds the GIL while it decodes (about 12 ms of CPU per second
of audio on a 2-core box, benchmarks/results/alignment_accuracy.json), so the server runs it in
a separate process (alignment/pool.py); one PocketsphinxAligner per thread or process.
"""

from __future__ import annotations

import re

import numpy as np
import soxr

from higgs_serve.alignment.aligner import Aligner, WordTiming
from higgs_serve.alignment.english_text import spoken_tokens
from higgs_serve.audio.formats import float_to_int16
from higgs_serve.errors import AlignmentError

DECODER_RATE_HZ = 16000  # the bundled acoustic model's sample rate
FRAME_S = 0.010  # one PocketSphinx frame
MIN_FRAMES = 3  # the least audio the decoder is given (its feature window spans a few frames)
SINGLE_LETTER_COST = 4  # a one-letter piece counts as this many pieces when spelling an unknown word
MAX_SPELLED_ACRONYM = 5
MAX_PIECE_LETTERS = 24  # longer dictionary pieces are not tried: spelling stays O(24 n) lookups
_VARIANT = re.compile(r"\(\d+\)$")  # "the(2)": the dictionary's second pronunciation of "the"
_NOT_SPOKEN = frozenset({"<sil>", "<s>", "</s>"})


class PocketsphinxAligner(Aligner):
    languages = frozenset({"English"})

    def __init__(self):
        from pocketsphinx import Decoder  # here: importing pocketsphinx loads its C library

        # bestpath off: the alignment grammar has one path, a lattice search adds nothing.
        # Beams off (0 = prune nothing): a full Viterbi pass over the one-path grammar. With the
        # default beams a single word said otherwise than the dictionary has it ("cat" for
        # "fox") prunes the only path and the whole sentence fails; unpruned costs ~1.5x the CPU.
        # lm=None: alignment needs the acoustic model and the dictionary only (set_align_text
        # makes the grammar); the bundled language model would cost a third of the start-up and
        # its memory for nothing (benchmarks/results/alignment_accuracy.json: same accuracy).
        self._decoder = Decoder(samprate=DECODER_RATE_HZ, bestpath=False, loglevel="FATAL",
                                beam=0.0, wbeam=0.0, pbeam=0.0, lm=None)
        self._added: set[str] = set()

    def align(self, audio: np.ndarray, sample_rate_hz: int, words: list[str]) -> list[WordTiming]:
        duration_s = len(audio) / sample_rate_hz
        tokens = [[self._known(token, word) for token in spoken_tokens(word)] for word in words]
        flat = [token for word_tokens in tokens for token in word_tokens]
        spans = self._align_tokens(audio, sample_rate_hz, flat) if flat else []
        return _per_word(words, tokens, spans, duration_s)

    # ------------------------------------------------------------------ dictionary
    def _known(self, token: str, written: str) -> str:
        """`token`, added to the dictionary first if it has no pronunciation there."""
        if token in self._added or self._decoder.lookup_word(token) is not None:
            return token
        phones = self._pronounce(token, written)
        self._decoder.add_word(token, phones, False)
        self._added.add(token)
        return token

    def _pronounce(self, token: str, written: str) -> str:
        letters = re.sub(r"[^a-z]", "", token) or "a"
        acronym = written.strip(".,;:!?\"'()").isupper() and len(letters) <= MAX_SPELLED_ACRONYM
        pieces = list(letters) if acronym else _fewest_pieces(letters, self._lookup)
        return " ".join(self._lookup(piece) for piece in pieces)

    def _lookup(self, piece: str) -> str | None:
        return self._decoder.lookup_word(piece)

    # ------------------------------------------------------------------ decoding
    def _align_tokens(self, audio: np.ndarray, sample_rate_hz: int,
                      tokens: list[str]) -> list[tuple[float, float]]:
        """[(start_s, end_s)] per token, in order."""
        signal = np.asarray(audio, dtype=np.float32)
        if sample_rate_hz != DECODER_RATE_HZ:
            signal = soxr.resample(signal, sample_rate_hz, DECODER_RATE_HZ, quality="HQ")
        if len(signal) < MIN_FRAMES * FRAME_S * DECODER_RATE_HZ:
            # less than the decoder's first analysis frames: it fails inside the utterance
            # (an IndexError) and keeps it open, refusing every later alignment
            raise AlignmentError(f"{len(audio) / sample_rate_hz:.3f} s of audio is too short to "
                                 f"align {len(tokens)} words with")
        decoder = self._decoder
        try:
            decoder.set_align_text(" ".join(tokens))
            decoder.start_utt()
            try:
                decoder.process_raw(float_to_int16(signal).tobytes(), full_utt=True)
            finally:
                decoder.end_utt()  # whatever happened: the next alignment starts a new utterance
        except RuntimeError as error:
            raise AlignmentError(f"the aligner could not align the text: {error}") from error
        if decoder.hyp() is None:
            raise AlignmentError(f"{len(signal) / DECODER_RATE_HZ:.2f} s of audio could not be "
                                 f"aligned with its {len(tokens)} words (too short for them?)")
        spans = [(seg.start_frame * FRAME_S, (seg.end_frame + 1) * FRAME_S)
                 for seg in decoder.seg() if _spoken(seg.word)]
        if len(spans) != len(tokens):  # the grammar has exactly one path through every token
            raise AlignmentError(f"the aligner returned {len(spans)} words for {len(tokens)}")
        return spans


def _spoken(name: str) -> bool:
    return name not in _NOT_SPOKEN and not name.startswith("[")


def _fewest_pieces(letters: str, lookup) -> list[str]:
    """`letters` as the cheapest sequence of dictionary entries (a one-letter piece costs
    SINGLE_LETTER_COST, any longer one 1). Every letter is a dictionary entry, so one exists."""
    n = len(letters)
    best: list[tuple[int, int]] = [(0, 0)] + [(10 ** 9, 0)] * n  # (cost, start of last piece)
    for end in range(1, n + 1):
        for start in range(max(0, end - MAX_PIECE_LETTERS), end):
            cost = best[start][0] + (SINGLE_LETTER_COST if end - start == 1 else 1)
            if cost < best[end][0] and lookup(letters[start:end]) is not None:
                best[end] = (cost, start)
    pieces, end = [], n
    while end > 0:
        start = best[end][1]
        pieces.append(letters[start:end])
        end = start
    return pieces[::-1]


def _per_word(words: list[str], tokens: list[list[str]], spans: list[tuple[float, float]],
              duration_s: float) -> list[WordTiming]:
    """One WordTiming per user word: its tokens' first start to last end, clipped to the audio;
    a word without tokens gets an empty span where the previous word ended."""
    timings: list[WordTiming] = []
    cursor, position = 0, 0.0
    for word, word_tokens in zip(words, tokens):
        if word_tokens:
            first, last = spans[cursor], spans[cursor + len(word_tokens) - 1]
            cursor += len(word_tokens)
            start = min(max(first[0], position), duration_s)
            end = min(max(last[1], start), duration_s)
            position = end
        else:
            start = end = position
        timings.append(WordTiming(word, round(start, 3), round(end, 3)))
    return timings

