"""Decoding only a window's kept frames (`decoder.decode_range`): the audio equals the same frames
of a whole-window decode (tiny geometry, float64, random weights, every kept range of several
window lengths), and the narrowing is what makes it cheaper (the real geometry's late stages
compute little more than the kept frames)."""

from __future__ import annotations


import pytest
import torch

from support.codec_fixtures import random_codec_tensors

from higgs_serve.codec.codec_config import CodecConfig
from higgs_serve.codec.decoder import CodecDecoder, decode_range


@pytest.fixture(scope="module")
def decoder() -> CodecDecoder:
    cfg = CodecConfig.tiny()
    dec = CodecDecoder(cfg)
    dec.load_state(random_codec_tensors(cfg, seed=2))
    return dec.double().eval()


def _ranges(frames: int) -> list[tuple[int, int]]:
    """Every kept range of a short window; of a long one, starts and ends at, near and far (past
    the 10-frame receptive field) from each edge, the streaming shapes among them."""
    if frames <= 13:
        return [(first, end) for first in range(frames) for end in range(first + 1, frames + 1)]
    starts, ends = (0, 1, 2, 10, 11, 12, 20), (19, 26, 27, 28, 35, 37, 38, 39)
    return [(first, end) for first in starts for end in ends if first < end]


@pytest.mark.parametrize("frames", [1, 5, 13, 39])
def test_kept_ranges_equal_the_whole_window_decode_cut(decoder, frames):
    hop = decoder.cfg.hop_length
    codes = torch.randint(0, decoder.cfg.codebook_size, (2, frames, decoder.cfg.num_quantizers),
                          generator=torch.Generator().manual_seed(frames))
    whole = decoder(codes)
    peak = float(whole.abs().max())
    for first, end in _ranges(frames):
        kept = decoder(codes, (first, end))
        assert kept.shape == (2, (end - first) * hop)
        assert float((kept - whole[:, first * hop : end * hop]).abs().max()) <= 1e-12 * peak, (first, end)


def test_a_whole_window_keep_is_the_plain_decode(decoder):
    codes = torch.randint(0, decoder.cfg.codebook_size, (1, 7, decoder.cfg.num_quantizers),
                          generator=torch.Generator().manual_seed(1))
    assert torch.equal(decoder(codes, (0, 7)), decoder(codes))


def test_steady_state_windows_compute_little_more_than_their_kept_frames():
    strides = CodecConfig().upsampling_ratios  # 8, 5, 4, 2, 3: the last block runs at 320 per frame
    for frames, keep in [(39, (10, 35)), (54, (25, 50))]:
        plan = decode_range(strides, frames, keep)
        lo, hi = plan.block_inputs[-1]  # the last block's input, 320 positions a frame
        assert (hi - lo) / 320 < keep[1] - keep[0] + 1  # under one frame more than the 25 kept
        assert plan.conv2_input == (keep[0] * 960 - 3, keep[1] * 960 + 3)
    # a first chunk keeps frame 0 of 5: the window's start is its own edge
    assert decode_range(strides, 5, (0, 1)).frames[0] == 0


@pytest.mark.parametrize("keep", [(0, 0), (3, 2), (0, 8), (-1, 2)])
def test_a_kept_range_outside_the_window_is_refused(keep):
    with pytest.raises(ValueError, match="keep frames"):
        decode_range((8, 5, 4, 2, 3), 7, keep)
