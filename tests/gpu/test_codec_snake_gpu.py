"""On CUDA: the fused Snake kernel reproduces the torch Snake, alone and inside the whole decoder
(skipped without CUDA)."""

from __future__ import annotations


import pytest
import torch

from support.codec_fixtures import random_codec_tensors
from support.snake_checks import SHAPES, check_fused_snake, check_non_contiguous, check_split_snake

from higgs_serve.codec.codec_config import CodecConfig
from higgs_serve.codec.decoder import CodecDecoder
from higgs_serve.codec.snake import snake, snake_triton


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_fused_snake_matches_torch(shape, dtype):
    check_fused_snake(shape, dtype, "cuda")


def test_fused_snake_non_contiguous_input():
    check_non_contiguous("cuda")


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_fused_split_snake_writes_the_bf16x3_operand(shape):
    check_split_snake(shape, "cuda")


def test_fused_snake_large_activation():
    """A [16, 32, 51840] last-layer activation (106 MB): rows × blocks indexing at scale."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = 3 * torch.randn(16, 32, 51840, device="cuda", generator=g)
    alpha = torch.rand(1, 32, 1, device="cuda", generator=g) + 0.5
    torch.testing.assert_close(snake_triton(x, alpha), snake(x, alpha), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_decoder_on_cuda_uses_the_fused_snake_and_matches_torch_snake(dtype):
    cfg = CodecConfig()
    dec = CodecDecoder(cfg).to(device="cuda", dtype=dtype).eval()
    dec.load_state(random_codec_tensors(cfg, seed=1))
    assert dec.snake is snake_triton  # picked once, when the module moved to CUDA
    codes = torch.randint(0, 1024, (2, 30, 8), generator=torch.Generator().manual_seed(0)).cuda()
    fused = dec(codes)
    dec.snake = snake
    reference = dec(codes)
    peak = reference.abs().max().item()
    diff = (fused - reference).abs().max().item()
    print(f"\ndecoder [2, 30, 8] {dtype}: max |fused - torch snake| = {diff:.2e} (peak {peak:.2f})")
    assert diff <= (1e-5 if dtype == torch.float32 else 5e-2) * max(peak, 1.0)
    assert dec.cpu().snake is snake
