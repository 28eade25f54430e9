"""The espeak-ng sentence with known word edges (tests/support/data, made by
`benchmarks/last_mile/bench_alignment.py --fixture`): real speech for aligner tests without espeak-ng."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

DATA = Path(__file__).resolve().parent / "data"


@dataclass(frozen=True)
class AlignedSpeech:
    text: str
    audio: np.ndarray  # [n] float32 at sample_rate_hz, a faint seeded noise floor added
    sample_rate_hz: int
    truth: list[tuple[str, float, float]]  # (word, start_s, end_s)


def aligned_speech(noise_rms: float = 1e-4, seed: int = 0) -> AlignedSpeech:
    meta = json.loads((DATA / "aligned_sentence.json").read_text())
    audio, rate = sf.read(DATA / "aligned_sentence.flac", dtype="float32")
    audio = audio + np.random.default_rng(seed).normal(0, noise_rms, len(audio)).astype(np.float32)
    truth = [(w["word"], w["start_s"], w["end_s"]) for w in meta["words"]]
    return AlignedSpeech(meta["text"], audio.astype(np.float32), rate, truth)
