"""The aligner contract: audio plus the words spoken in it -> one time span per word.

The words are the user's: `user_words(text)` splits the input on whitespace after removing the
inline control tags (`<|emotion:happy|>`, `<|prosody:pause|>`, ...), which are instructions, not
speech; a tag counts as a separator, so `Hello<|prosody:pause|>world` is two words. An aligner
returns exactly one `WordTiming` per word, in input order, each inside the audio
(0 <= start_s <= end_s <= duration), whatever it does inside (normalising numbers, dropping
punctuation, reading words it has no pronunciation for): docs/api.md#word-timestamps.

Implementations keep their own language list, so a multilingual aligner can be added beside the
English one (alignment/registry.py picks by the request's language).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from higgs_serve.text.tags import TAG


@dataclass(frozen=True)
class WordTiming:
    word: str  # the user's word, exactly as written in the input
    start_s: float  # seconds from the start of the audio that was aligned
    end_s: float

    def shifted(self, offset_s: float) -> WordTiming:
        """The same word on a timeline that starts `offset_s` earlier (a segment's start)."""
        return WordTiming(self.word, self.start_s + offset_s, self.end_s + offset_s)

    def scaled(self, factor: float) -> WordTiming:
        """The same word on a timeline stretched by `factor` (1 / speed after a time stretch)."""
        return WordTiming(self.word, self.start_s * factor, self.end_s * factor)

    def to_json(self) -> dict:
        """The peers' shape (vllm-omni's `{word, start_ms, end_ms}`), whole milliseconds."""
        return {"word": self.word, "start_ms": round(1e3 * self.start_s),
                "end_ms": round(1e3 * self.end_s)}


def user_words(text: str) -> list[str]:
    """The words an aligner times: `text` without inline tags, split on whitespace."""
    return TAG.sub(" ", text).split()


class Aligner(ABC):
    """Forced alignment for some languages. Instances may hold a loaded model: one per thread
    or process (implementations say whether they are thread-safe)."""

    #: English names of the languages this aligner reads (peer_fields.LANGUAGES' values)
    languages: frozenset[str]

    @abstractmethod
    def align(self, audio: np.ndarray, sample_rate_hz: int, words: list[str]) -> list[WordTiming]:
        """audio: [n] float32 mono at `sample_rate_hz`; words: `user_words` of what was spoken.
        Returns one WordTiming per word, in order, inside the audio. Raises AlignmentError when
        the audio cannot hold the words (e.g. far too short for them)."""
