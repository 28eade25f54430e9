"""The speech evidence the verdict needs (audio/speech_evidence.py) and the verdict's rule
(audio/watermark_detect.py): what is not speech is never `marked`, whatever the network scores."""

from __future__ import annotations

import numpy as np
import pytest

from higgs_serve.audio.speech_evidence import Evidence, SpeechEvidence
from higgs_serve.audio.watermark_detect import INCONCLUSIVE, MARKED, NOT_MARKED, verdict
from support.speechlike import speechlike

RATE = 24_000
rng = np.random.default_rng(0)
T = np.arange(5 * RATE) / RATE


def _evidence(audio: np.ndarray, pushes: int = 7) -> Evidence:
    found = SpeechEvidence()
    for piece in np.array_split(audio.astype(np.float32), pushes):  # any split, same answer
        found.push(piece)
    return found.finish()


@pytest.mark.parametrize("name, audio", [
    ("tone_110", 0.3 * np.sin(2 * np.pi * 110 * T)),
    ("tone_440", 0.3 * np.sin(2 * np.pi * 440 * T)),
    ("chord", sum(0.1 * np.sin(2 * np.pi * f * T) for f in (261.6, 329.6, 392.0))),
    ("pulsed_tone", 0.3 * np.sin(2 * np.pi * 1000 * T) * (np.sin(2 * np.pi * 4 * T) > 0)),
    ("sweep", 0.3 * np.sin(2 * np.pi * np.cumsum(np.geomspace(100, 4000, T.size)) / RATE)),
    ("silence", np.zeros(T.size)),
    ("white_noise", 0.1 * rng.standard_normal(T.size)),
    ("clipped_tone", np.clip(3 * np.sin(2 * np.pi * 150 * T), -0.5, 0.5)),
])
def test_what_is_not_speech_is_not_speech_like(name, audio):
    assert not _evidence(audio).speech_like, name


def test_speech_like_audio_is_and_the_split_does_not_matter():
    audio = speechlike(6.0, 11)
    assert _evidence(audio).speech_like
    assert _evidence(audio, 1) == _evidence(audio, 13)


def test_the_verdict_rule():
    speech = Evidence(active_s=4.0, depth_db=12.0, dips_per_s=3.0, rich_bins=25.0)
    tone = Evidence(active_s=5.0, depth_db=0.0, dips_per_s=0.0, rich_bins=3.0)
    assert verdict(0.99, 1.0, tone) == INCONCLUSIVE  # the tone: high score, no speech
    assert verdict(0.99, 0.98, speech) == MARKED
    assert verdict(0.05, 0.0, speech) == NOT_MARKED
    assert verdict(0.8, 0.4, speech) == INCONCLUSIVE  # a mark in part of the frames only


def test_an_inconclusive_verdict_names_its_actual_cause():
    """Issue 61: the detector knows which minimum failed; the CLI's line says that one only."""
    from higgs_serve.audio.watermark_detect import MARKED_IN_PART, TOO_LITTLE_SPEECH, Finding
    from higgs_serve.cli import verdict_line

    speech = Evidence(active_s=4.0, depth_db=12.0, dips_per_s=3.0, rich_bins=25.0)
    noise = Evidence(active_s=20.0, depth_db=2.0, dips_per_s=0.1, rich_bins=40.0)  # the tiny model's 20 s
    cases = [(Finding(verdict(1.0, 1.0, noise), 1.0, 1.0, noise), TOO_LITTLE_SPEECH, "too little speech-like audio"),
             (Finding(verdict(0.8, 0.4, speech), 0.8, 0.4, speech), MARKED_IN_PART, "marked in part only, 40% of"),
             (Finding(verdict(0.99, 0.98, speech), 0.99, 0.98, speech), None, "marked"),
             (Finding(verdict(0.05, 0.0, speech), 0.05, 0.0, speech), None, "not marked")]
    for found, reason, words in cases:
        assert found.reason == reason
        assert verdict_line(found).split(": ", 1)[-1].startswith(words), verdict_line(found)
    assert "marked in part" not in verdict_line(cases[0][0])
    assert "too little" not in verdict_line(cases[1][0])
