"""Checks shared by the fused-Snake tests: on CUDA (tests/gpu) and under Triton's interpreter on
CPU (tests/unit, only when TRITON_INTERPRET=1 was set before the run started)."""

from __future__ import annotations

import torch

from higgs_serve.codec.snake import snake, snake_split_triton, snake_triton

# [B, C, L]: rows shorter and longer than the short block, a ragged tail, a single element,
# and one row of a real last layer (L = 960 · 5 frames).
SHAPES = [(1, 1, 1), (2, 5, 3), (1, 7, 64), (2, 3, 65), (3, 4, 2100), (1, 32, 4800)]


def inputs(shape, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(shape, generator=g)).to(device=device, dtype=dtype)
    alpha = (torch.rand(1, shape[1], 1, generator=g) + 0.5).to(device=device, dtype=dtype)
    return x, alpha


def check_fused_snake(shape, dtype, device) -> None:
    """float32: the reference to ~1e-6 relative. bfloat16/float16: the kernel rounds once (torch
    after every op), so it is held to one ulp of the float32 math on the same rounded inputs, and
    to a few ulps of the torch result in that dtype."""
    x, alpha = inputs(shape, dtype, device)
    got = snake_triton(x, alpha)
    assert got.shape == x.shape and got.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(got, snake(x, alpha), rtol=1e-6, atol=1e-6)
        return
    exact = snake(x.float(), alpha.float())
    ulp = torch.finfo(dtype).eps  # one ulp relative (bf16 2^-7, fp16 2^-10)
    torch.testing.assert_close(got.float(), exact, rtol=ulp, atol=ulp)
    # torch rounds αx before its sin: an ulp of |αx| (up to ~15 here) moves sin²/α by ~2^-4 in bf16
    torch.testing.assert_close(got.float(), snake(x, alpha).float(), rtol=4 * ulp, atol=16 * ulp)


def check_non_contiguous(device) -> None:
    x, alpha = inputs((2, 6, 40), torch.float32, device)
    xt = x.transpose(0, 1).contiguous().transpose(0, 1)  # same values, not contiguous
    assert not xt.is_contiguous()
    torch.testing.assert_close(snake_triton(xt, alpha), snake(x, alpha), rtol=1e-6, atol=1e-6)


def check_split_snake(shape, device) -> None:
    """The bf16x3 operand (split_conv.py): blocks hi, lo, hi of the biased float32 Snake, with
    hi + lo equal to it to 2^-15 relative (the interpreter truncates its bf16 casts, the GPU
    rounds: both pass)."""
    x, alpha = inputs(shape, torch.float32, device)
    bias = torch.linspace(-1, 1, shape[1], device=device)
    want = snake(x + bias[:, None], alpha)
    for b in (bias, None):
        got = snake_split_triton(x, alpha, b)
        c = shape[1]
        assert got.shape == (shape[0], 3 * c, shape[2]) and got.dtype == torch.bfloat16
        assert torch.equal(got[:, :c], got[:, 2 * c :])
        ref = want if b is not None else snake(x, alpha)
        torch.testing.assert_close(got[:, :c].float() + got[:, c : 2 * c].float(), ref, rtol=2.0**-15, atol=1e-6)
