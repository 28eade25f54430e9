"""Issue 3: frame caps and natural ends (docs/model.md#length-caps).

The random tiny talker almost never samples EOC (about 1 in 1026 per row), so to exercise
natural ends this module loads its own copy of the model and points codebook 0's EOC row of the
tied audio table along the mean final hidden state: EOC then wins every greedy step where the
rules allow it, i.e. exactly at row `min_frames`.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_harness import CPU, TEXTS, ManualEngine, engine_deploy, sampling, speech

from higgs_serve.engine.builder import load_model
from higgs_serve.engine.input_processor import text_frame_cap
from higgs_serve.errors import InvalidRequestError
from higgs_serve.model.delay_pattern import rows_to_codec_frames

EOC = 1025
BOC = 1024


@pytest.fixture(scope="module")
def eoc_engine(tiny_model_dir):
    loaded = load_model(str(tiny_model_dir), CPU)  # a private copy: its weights get edited
    talker = loaded.talker
    hidden = []
    audio_logits = talker.audio_logits
    talker.audio_logits = lambda h: (hidden.append(h.clone()), audio_logits(h))[1]
    probe = ManualEngine(loaded, engine_deploy(max_num_seqs=4))
    probe.generate([speech(f"probe{i}", t, sampling(0.8, i, frames=20)) for i, t in enumerate(TEXTS[:4])])
    probe.close()
    del talker.audio_logits
    direction = torch.cat(hidden).mean(dim=0)  # [D]
    with torch.no_grad():
        # codebook 0's EOC row of W_a (tied head): logit = h . direction * 40 / |direction|
        talker.audio_embedding[EOC] = direction / direction.norm() * 40.0
    eng = ManualEngine(loaded, engine_deploy(max_num_seqs=4))
    yield eng
    eng.close()


def test_max_new_tokens_cap_gives_exactly_n_frames(default_engine):
    results = default_engine.generate([speech(f"c{n}", TEXTS[2], sampling(0.8, n, frames=n)) for n in (1, 9, 13)])
    for n, res in zip((1, 9, 13), results):
        assert res.finish_reason == "length"
        assert res.frames.shape == (n, 8) and len(res.audio) == n * 960
        # capped: codebook 0 forced to EOC at row n, then the 7-row ramp
        assert res.rows.shape == (n + 8, 8) and res.rows[n, 0] == EOC
        np.testing.assert_array_equal(rows_to_codec_frames(res.rows, finished_naturally=True), res.frames)


def test_natural_end_is_stop_with_exactly_r_frames(eoc_engine):
    for stream in (False, True):
        (res,) = eoc_engine.generate([speech("nat", TEXTS[3], sampling(0.0, frames=60), stream=stream)])
        r = len(res.frames)
        assert res.finish_reason == "stop"
        assert r == 8  # EOC at the first row the minimum-length rule allows
        assert res.rows.shape == (r + 8, 8) and res.rows[r, 0] == EOC and EOC not in res.rows[:r, 0]
        np.testing.assert_array_equal(rows_to_codec_frames(res.rows, finished_naturally=True), res.frames)
        assert len(res.audio) == r * 960 and sum(c.num_frames for c in res.chunks) == r
        assert res.chunks[-1].finish_reason == "stop"
        assert not np.isin(res.frames, (BOC, EOC)).any()


def test_min_new_tokens_delays_the_end(eoc_engine):
    fixed, later = eoc_engine.generate([
        speech("fixed", TEXTS[3], sampling(0.0, frames=30, min_frames=30)),
        speech("later", TEXTS[3], sampling(0.0, frames=40, min_frames=20)),
    ])
    # min = max: fixed length even though the model wants to stop at every row
    assert fixed.finish_reason == "length" and fixed.frames.shape == (30, 8)
    assert later.finish_reason == "stop" and later.frames.shape == (20, 8)
    assert later.rows[20, 0] == EOC and EOC not in later.rows[:20, 0]


def test_min_new_tokens_above_the_text_cap_is_refused_naming_the_limit(default_engine):
    """Issue 27 item 6: `min_new_tokens` forbids an earlier end, so a value above the text's
    frame cap (which would have lowered it silently) is refused, and the cap itself is served."""
    prompts = default_engine.core.inputs.prompts
    cap = text_frame_cap(prompts.count_text_tokens("hi"), frame_rate=25)
    with pytest.raises(InvalidRequestError, match=rf"min_new_tokens=300 .*limit of this text: {cap} frames") as err:
        default_engine.submit(speech("over", "hi", sampling(frames=300, min_frames=300)))
    assert err.value.param == "min_new_tokens"
    assert default_engine.core.stats()["num_waiting"] == 0  # nothing was admitted
    (res,) = default_engine.generate([speech("at-cap", "hi", sampling(frames=300, min_frames=cap))])
    assert res.finish_reason == "length" and res.frames.shape == (cap, 8)  # min = cap: exactly the cap
