"""The padded batch's layout (audio/perth/rows.py), NumPy only: bucket choice, and rows whose
last frames read exactly what the window's own centred STFT reads."""

from __future__ import annotations

import numpy as np
import pytest

from higgs_serve.audio.perth.rows import (
    EDGE,
    HOP,
    N_FFT,
    bucket_frames,
    fill_rows,
    length_ladder,
    row_samples,
    window_frames,
)

RNG = np.random.default_rng(5)


def test_a_window_has_its_centred_stft_frames_and_short_ones_get_silence_first():
    assert window_frames(960) == 5 and window_frames(5280 + 24_000) == 123
    assert window_frames(1000) == 5  # not a whole number of hops: the frames that start in it
    assert window_frames(1) == window_frames(EDGE + 1) == 4
    assert row_samples(16) == 15 * HOP + N_FFT


def test_buckets_are_the_smallest_captured_length_that_holds_the_longest_window():
    ladder = length_ladder(5280 + 25 * 960)
    assert ladder == (16, 32, 64, 128)
    assert length_ladder(960) == (16,)
    assert [bucket_frames(f, ladder) for f in (4, 5, 16, 17, 39, 123, 128)] == [16, 16, 16, 32, 64, 128, 128]
    assert bucket_frames(129, ladder) == 129  # longer than anything captured: its own length
    assert bucket_frames(5) == 5 and bucket_frames(123, ()) == 123  # no ladder (the CPU): exact


@pytest.mark.parametrize("n", [960, 5280 + 3840, 1000, 300, 769])
def test_a_rows_last_frames_read_exactly_the_windows_own_padded_samples(n):
    window = RNG.standard_normal(n).astype(np.float32)
    frames = 64
    rows = np.full((3, row_samples(frames)), np.nan, np.float32)  # what a reused buffer may hold
    valid = np.full((3, frames), np.nan, np.float32)
    (start, end), = fill_rows([window], rows, valid)
    own = window_frames(n)
    alone = np.concatenate([np.zeros(max(EDGE + 1 - n, 0), np.float32), window])  # short: silence first
    padded = np.pad(alone, EDGE, mode="reflect")[: row_samples(own)]  # what torch.stft(center=True) frames
    lead = HOP * (frames - own)
    np.testing.assert_array_equal(rows[0, lead:], padded)
    assert not rows[0, :lead].any()  # the padding's frames read silence
    np.testing.assert_array_equal(valid[0], np.r_[np.zeros(frames - own), np.ones(own)])
    assert not valid[1:].any()  # rows past the windows are invalid; their samples are left alone
    assert np.isnan(rows[1:]).all()
    # the change comes back as HOP * frames samples from the first unpadded sample: the window's
    # own samples are the last ones of its silence-padded version
    assert end - start == n and end == lead + alone.size


def test_rows_refuse_a_window_longer_than_the_bucket_or_more_windows_than_rows():
    rows, valid = np.zeros((2, row_samples(16)), np.float32), np.zeros((2, 16), np.float32)
    with pytest.raises(ValueError, match="needs 17 frames, the batch has 16"):
        fill_rows([np.zeros(16 * HOP, np.float32)], rows, valid)
    with pytest.raises(ValueError, match="do not hold 3 windows"):
        fill_rows([np.zeros(10, np.float32)] * 3, rows, valid)
