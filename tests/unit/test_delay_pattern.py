import numpy as np
import pytest
import torch

from higgs_serve.model.delay_pattern import (
    BOC, EOC, MAX_DELAY, NUM_CODEBOOKS, apply_delay, boc_id, eoc_id, num_complete_frames,
    num_output_frames, revert_delay, rows_to_codec_frames, sanitize_codes,
)


def _frames(num_frames: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1024, (num_frames, NUM_CODEBOOKS), dtype=np.int64)


def test_constants():
    assert (BOC, EOC, NUM_CODEBOOKS, MAX_DELAY) == (1024, 1025, 8, 7)
    assert boc_id(10) == 8 and eoc_id(10) == 9


def test_apply_delay_layout():
    frames = _frames(5)
    rows = apply_delay(frames)
    assert rows.shape == (12, 8) and rows.dtype == np.int64
    for q in range(8):
        for r in range(12):
            if r < q:
                assert rows[r, q] == BOC
            elif r >= q + 5:
                assert rows[r, q] == EOC
            else:
                assert rows[r, q] == frames[r - q, q]


def test_apply_delay_empty_clip():
    rows = apply_delay(torch.zeros((0, 8), dtype=torch.int64))
    assert rows.shape == (7, 8)
    expected = np.array([[BOC if r < q else EOC for q in range(8)] for r in range(7)])
    assert np.array_equal(rows, expected)


def test_revert_inverts_apply_and_accepts_torch():
    frames = _frames(9, seed=1)
    assert np.array_equal(revert_delay(apply_delay(frames)), frames)
    assert np.array_equal(revert_delay(apply_delay(torch.from_numpy(frames))), frames)
    assert revert_delay(np.zeros((7, 8), dtype=np.int64)).shape == (0, 8)


def test_shape_errors_name_the_tensor():
    with pytest.raises(ValueError, match="frames"):
        apply_delay(torch.zeros((3, 7), dtype=torch.int64))
    with pytest.raises(ValueError, match="rows"):
        revert_delay(torch.zeros((6, 8), dtype=torch.int64))
    with pytest.raises(ValueError, match="integer"):
        revert_delay(torch.zeros((9, 8)))


def test_natural_end_yields_exactly_r_frames():
    frames = _frames(6, seed=2)
    final = np.array([[EOC, 5, 6, 7, 8, 9, 10, 11]])  # the EOC frame: its other codes are free
    rows = apply_delay(np.concatenate([frames, final]))  # R + 8 rows, as a natural end emits
    assert rows.shape[0] == 6 + 8
    out = rows_to_codec_frames(rows, finished_naturally=True)
    assert np.array_equal(out, frames)
    assert num_output_frames(rows.shape[0], finished_naturally=True) == 6


def test_cut_request_keeps_every_complete_frame():
    frames = _frames(10, seed=3)
    rows = apply_delay(frames)[:13]  # cut mid-stream: 13 rows -> 6 complete frames
    out = rows_to_codec_frames(rows, finished_naturally=False)
    assert np.array_equal(out, frames[:6])
    assert num_output_frames(13, finished_naturally=False) == 6


def test_frames_with_eoc_on_codebook0_are_dropped_and_specials_zeroed():
    frames = _frames(4, seed=4)
    frames[1, 0] = EOC  # an end marker inside: dropped
    frames[2, 3] = EOC  # a stray special on another codebook: replaced by 0, not clamped
    frames[3, 5] = BOC
    out = rows_to_codec_frames(apply_delay(frames), finished_naturally=False)
    assert out.shape == (3, 8)
    expected = frames[[0, 2, 3]].copy()
    expected[1, 3] = 0
    expected[2, 5] = 0
    assert np.array_equal(out, expected)


def test_sanitize_replaces_negative_and_special_codes():
    codes = torch.tensor([[-1, 0, 1023, 1024, 1025, 2000, 5, 6]])
    assert sanitize_codes(codes).tolist() == [[0, 0, 1023, 0, 0, 0, 5, 6]]


def test_too_few_rows_give_no_frames():
    assert rows_to_codec_frames(torch.zeros((3, 8), dtype=torch.int64), False).shape == (0, 8)
    assert rows_to_codec_frames(torch.zeros((7, 8), dtype=torch.int64), True).shape == (0, 8)


def test_num_complete_frames():
    assert [num_complete_frames(n) for n in (0, 6, 7, 8, 20)] == [0, 0, 0, 1, 13]
    assert num_output_frames(0, True) == 0 and num_output_frames(8, True) == 0
