"""Word timestamps by forced alignment: the `Aligner` contract, its implementations (English:
PocketSphinx) and the text normalisation they need. Pure CPU work with no engine or server
imports; the server runs it off its event loop and the engine's thread (server/last_mile/word_timestamps.py)."""

from higgs_serve.alignment.aligner import Aligner, WordTiming, user_words
from higgs_serve.alignment.registry import aligner_for, build_aligner, supported_languages

__all__ = ["Aligner", "WordTiming", "aligner_for", "build_aligner", "supported_languages", "user_words"]
