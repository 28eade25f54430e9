"""CodecDecoder vs transformers' HiggsAudioV2TokenizerModel.decode (tiny geometry, random weights)."""

from __future__ import annotations

import pytest
import torch
from support.codec_fixtures import tiny_codec_module

from higgs_serve.codec.decoder import CodecDecoder, check_codes, snake


@pytest.fixture(scope="module")
def setup():
    return tiny_codec_module(CodecDecoder)


@pytest.mark.parametrize("frames", [1, 7, 30])
def test_decode_matches_transformers(setup, frames):
    codec, ours = setup
    g = torch.Generator().manual_seed(frames)
    codes = torch.randint(0, codec.cfg.codebook_size, (2, frames, 8), generator=g)  # [B, T, 8]
    with torch.no_grad():
        ref = codec.reference.decode(codes.transpose(1, 2), return_dict=False)  # [B, 1, T·960]
    got = ours(codes)
    assert got.shape == (2, frames * 960) and got.dtype == torch.float32
    assert ref.shape == (2, 1, frames * 960)
    assert ref.abs().max() > 0.05  # the random weights give a non-trivial signal
    assert (got - ref[:, 0]).abs().max().item() <= 1e-4


def test_batch_rows_are_independent(setup):
    codec, ours = setup
    codes = torch.randint(0, 1024, (3, 5, 8), generator=torch.Generator().manual_seed(3))
    batched = ours(codes)
    alone = ours(codes[1:2])
    assert (batched[1:2] - alone).abs().max().item() <= 1e-4


def test_snake_formula():
    x = torch.linspace(-3, 3, 13).view(1, 1, -1)
    alpha = torch.full((1, 1, 1), 0.7)
    want = x + torch.sin(0.7 * x) ** 2 / (0.7 + 1e-9)
    torch.testing.assert_close(snake(x, alpha), want)


def test_check_codes_rejects_specials_and_wrong_shape(setup):
    codec, ours = setup
    check_codes(torch.zeros(1, 2, 8, dtype=torch.int64), 1024)
    with pytest.raises(ValueError, match="replace special codes"):
        check_codes(torch.full((1, 2, 8), 1025), 1024)
    with pytest.raises(ValueError, match="int64"):
        check_codes(torch.zeros(1, 2, 8, dtype=torch.int32), 1024)
    with pytest.raises(ValueError, match=r"\[B, T, 8\]"):
        ours(torch.zeros(1, 2, 7, dtype=torch.int64))


def test_load_state_requires_every_decoder_tensor(setup):
    codec, _ = setup
    fresh = CodecDecoder(codec.cfg)
    partial = {k: v for k, v in codec.tensors.items() if k != "fc2.bias"}
    with pytest.raises(KeyError, match="fc2.bias"):
        fresh.load_state(partial)
