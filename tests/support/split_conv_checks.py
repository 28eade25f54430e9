"""Checks shared by the bf16x3 convolution tests: on CUDA (tests/gpu) and under Triton's
interpreter on CPU (tests/unit, only when TRITON_INTERPRET=1 was set before the run started)."""

from __future__ import annotations

import torch

from higgs_serve.codec.split_conv import SplitConv, _conv_triton, _tiles, matmul_f32, split_bf16, taps


def randn(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def check_conv_split(device: str, dtype: torch.dtype = torch.bfloat16) -> None:
    """The Triton implicit GEMM (`split_conv._conv_triton`) against the taps + GEMM form on the
    same split operands: k7 at dilations 1 / 3 / 9 and k1 with bias and residual, lengths that
    do and do not fill a 128-sample tile. Shared with tests/gpu (compiled, bf16 operands) and
    the interpreter (float32 operands: its bf16 loads and dots are not numpy's to do)."""
    for c, k, d, length in [(32, 7, 9, 300), (64, 7, 1, 128), (32, 1, 1, 70), (128, 7, 3, 5)]:
        x = randn(2, c, length, seed=c + d)
        hi, lo = split_bf16(x)
        split = torch.cat([hi, lo, hi], dim=1)
        conv = SplitConv.of(randn(c, c, k, seed=k) / c)
        bias, residual = randn(c, seed=5), randn(2, c, length, seed=6)
        assert _tiles(3 * c, c)
        want = matmul_f32(conv.flat, split if k == 1 else taps(split, d, k)) + bias[:, None] + residual
        on_device = SplitConv(conv.flat.to(device, dtype), conv.by_tap.to(device, dtype), conv.kernel)
        got = _conv_triton(split.to(device, dtype), on_device, d, bias.to(device), residual.to(device))
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
