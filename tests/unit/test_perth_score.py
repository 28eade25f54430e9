"""PerTh's detector run block by block (audio/perth/score.py) gives the whole clip's score: the
same STFT frames (centred, reflected edges), the same frame mask, each stack's output frames
computed with their full receptive field, the same interpolation to each stack's rate."""

from __future__ import annotations

import numpy as np
import pytest

from higgs_serve.audio.perth import score as perth_score
from higgs_serve.audio.perth.network import N_FFT
from higgs_serve.audio.perth.score import ClipScorer, score_clip
from higgs_serve.audio.watermark import embed, load_watermarker
from support.speechlike import speechlike


@pytest.fixture(scope="module")
def wm():
    return load_watermarker("perth", "cpu")


@pytest.mark.parametrize("seconds", [N_FFT / 24_000 + 1e-4, 0.09, 1.0, 7.3])
def test_block_by_block_equals_the_whole_clip(wm, seconds, monkeypatch):
    monkeypatch.setattr(perth_score, "BLOCK_FRAMES", 64)  # many blocks, even for a short clip
    monkeypatch.setattr(perth_score, "STFT_BLOCK_FRAMES", 50)
    audio = speechlike(seconds, 5)
    for clip in (audio, embed(wm, audio)):
        whole = wm.score(clip)
        scorer = ClipScorer(wm)
        for start in range(0, clip.size, 3001):  # pushes that split frames anywhere
            scorer.push(clip[start: start + 3001])
        assert abs(scorer.finish().score - whole) < 1e-5
        assert abs(score_clip(wm, clip).score - whole) < 1e-5


def test_too_short_and_marked_fraction(wm):
    assert score_clip(wm, np.zeros(N_FFT, np.float32)).score == 0.0
    marked = score_clip(wm, embed(wm, speechlike(4.0, 2)))
    plain = score_clip(wm, speechlike(4.0, 2))
    assert marked.marked_frame_fraction > 0.9 and plain.marked_frame_fraction < 0.2
    assert marked.judged_frames > 0 and plain.judged_frames > 0
