"""engine/long_form.py pieces without an engine: the seam ramp, per-segment seeds, and a
segment's own output as the next segment's reference."""

from __future__ import annotations

import numpy as np

from higgs_serve.engine.long_form import SeamRamp, chained_reference, segment_seed
from higgs_serve.config.validators import SEED_MAX


def test_ramp_makes_the_join_continuous_and_fades_out():
    ramp = SeamRamp(ramp_samples=240)
    ramp.new_segment()
    first = ramp.apply(np.full(1000, 0.5, np.float32))
    assert np.all(first == 0.5)  # the first segment is untouched
    ramp.new_segment()
    # the next segment arrives in pieces shorter than the ramp
    pieces = [ramp.apply(np.full(n, -0.5, np.float32)) for n in (100, 100, 800)]
    second = np.concatenate(pieces)
    joined = np.concatenate([first, second])
    steps = np.abs(np.diff(joined))
    assert second[0] == 0.5  # starts where the first ended
    assert steps.max() < 1.0 * np.pi / 240  # the 1.0 offset spread over 10 ms
    assert np.all(second[240:] == -0.5)  # after the ramp: the segment's own samples
    assert len(second) == 1000  # nothing added or removed


def test_ramp_of_zero_is_plain_concatenation():
    ramp = SeamRamp(ramp_samples=0)
    ramp.apply(np.full(10, 0.5, np.float32))
    ramp.new_segment()
    assert np.all(ramp.apply(np.full(10, -0.5, np.float32)) == -0.5)


def test_segment_seeds():
    assert segment_seed(None, 3) is None
    assert [segment_seed(7, k) for k in range(3)] == [7, 8, 9]
    assert segment_seed(SEED_MAX, 1) == 0


def test_chained_reference_uses_the_transcript_without_tags():
    codes = np.arange(16, dtype=np.int64).reshape(2, 8)
    ref = chained_reference(codes, "<|emotion:happy|> Hello  there. <|prosody:pause|>")
    assert ref.ref_text == "Hello there."
    np.testing.assert_array_equal(ref.codes, codes)
    assert ref.content_key == chained_reference(codes.copy(), "x").content_key
    assert chained_reference(codes, "<|sfx:cough|>").ref_text is None
