"""Snake activation (docs/model.md#codec-geometry): Snake(x) = x + sin²(αx)/(α + 1e-9), α per channel.

The codec decoder applies it 29 times per decode, on activations up to [64, 32, 51840] (425 MB in
float32 at 64 windows of 54 frames). Written in torch it is five kernels (αx, sin, square, scale,
add), each a full pass over the activation; `snake_triton` is one read and one write, with the
math in float32 and the result rounded once to the input dtype.

`snake` (plain torch) is the reference and the CPU path; `snake_for(device)` picks the
implementation once (the decoder re-picks it when it is moved, never per call). The split form
(`snake_split`, for the "bf16x3" codec precision) adds the bias of the convolution before it and
writes its float32 result as the bf16 operand of the convolution after it (split_conv.py), in the
same one pass.
In float32 the kernel performs the reference's operations in the reference's order with the
same rounding (libdevice sinf, IEEE reciprocal, no FMA contraction), so the two agree to
within an ulp; in bfloat16/float16 the kernel rounds once where torch rounds after every
operation, so it is the more accurate of the two.
"""

from __future__ import annotations

import os
from typing import Callable

import torch
from torch import Tensor

from higgs_serve.codec.split_conv import split_bf16

try:
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice

    from higgs_serve.kernels.launcher import Launcher, cdiv
except ImportError:  # CPU-only installs
    triton = None

SnakeFn = Callable[[Tensor, Tensor], Tensor]
SplitSnakeFn = Callable[[Tensor, Tensor, "Tensor | None"], Tensor]
SNAKE_EPS = 1e-9
# Rows no longer than this use a small block (the first layers of a short window: L = T frames);
# longer rows use _LONG_BLOCK. Two block sizes only, so the start-up warm-up compiles every
# variant and no window length seen later triggers a Triton compile on live traffic.
_SHORT_BLOCK = 64
_LONG_BLOCK = 1024
# TRITON_INTERPRET=1 runs kernels on CPU tensors with numpy (how the math is checked off the GPU).
_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


def snake(x: Tensor, alpha: Tensor) -> Tensor:
    """Reference: x [B, C, L], alpha [1, C, 1] -> [B, C, L] (every op rounds in x's dtype)."""
    return x + (alpha + SNAKE_EPS).reciprocal() * torch.sin(alpha * x).pow(2)


def snake_split(x: Tensor, alpha: Tensor, bias: Tensor | None) -> Tensor:
    """Reference: Snake of float32 x [B, C, L] (+ bias [C] first), as the split operand of a
    bf16x3 convolution: [B, 3C, L] bf16, channel blocks hi, lo, hi (split_conv.py)."""
    if bias is not None:
        x = x + bias[:, None]
    hi, lo = split_bf16(snake(x, alpha))
    return torch.cat([hi, lo, hi], dim=1)


if triton is not None:

    # Not specialised on L: Triton would otherwise compile a variant per L % 16 == 0 / L == 1,
    # and a window length first seen on live traffic (a final window of 16 frames) would stall
    # the codec thread on a compile.
    @triton.jit(do_not_specialize=["C", "L"])
    def _snake_kernel(X, ALPHA, BIAS, Y, C, L, eps, BLOCK: tl.constexpr, LIBDEVICE: tl.constexpr,
                      HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr):
        row = tl.program_id(0)  # b * C + c
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < L
        base = row.to(tl.int64) * L  # [B, C, L] contiguous: rows can pass 2**31 elements in all
        c = row % C
        a = tl.load(ALPHA + c).to(tl.float32)
        inv = tl.math.div_rn(1.0, a + eps)  # IEEE 1/x, as torch's reciprocal
        x_in = tl.load(X + base + offs, mask=mask, other=0.0)
        x = x_in.to(tl.float32)
        if HAS_BIAS:  # the bias of the convolution that made X (split_conv.py leaves it out)
            x = x + tl.load(BIAS + c).to(tl.float32)
        if LIBDEVICE:
            s = libdevice.sin(a * x)  # __nv_sinf, the sinf torch's CUDA sin calls
        else:
            s = tl.sin(a * x)  # Triton's interpreter (CPU) has no libdevice
        y = x + inv * (s * s)
        if SPLIT:  # Y [B, 3C, L] bf16: channel blocks hi, lo, hi (split_conv.py)
            block = C.to(tl.int64) * L
            out = ((row // C) * 3 * C + c).to(tl.int64) * L + offs
            hi = y.to(tl.bfloat16)
            lo = (y - hi.to(tl.float32)).to(tl.bfloat16)
            tl.store(Y + out, hi, mask=mask)
            tl.store(Y + out + block, lo, mask=mask)
            tl.store(Y + out + 2 * block, hi, mask=mask)
        else:
            tl.store(Y + base + offs, y.to(x_in.dtype), mask=mask)

    _snake = Launcher(_snake_kernel)


def snake_triton(x: Tensor, alpha: Tensor) -> Tensor:
    """One-pass CUDA Snake: x [B, C, L] (float32/bfloat16/float16), alpha [1, C, 1] -> x's dtype."""
    return _launch(x, alpha, None, split=False)


def snake_split_triton(x: Tensor, alpha: Tensor, bias: Tensor | None) -> Tensor:
    """`snake_split` in one pass on CUDA: float32 x [B, C, L] -> [B, 3C, L] bf16."""
    return _launch(x, alpha, bias, split=True)


def _launch(x: Tensor, alpha: Tensor, bias: Tensor | None, split: bool) -> Tensor:
    if x.ndim != 3 or alpha.numel() != x.shape[1] or (bias is not None and bias.numel() != x.shape[1]):
        raise ValueError(f"snake: x must be [B, C, L] and alpha (and a bias) hold C values, got {list(x.shape)} "
                         f"and {list(alpha.shape)}")
    x = x.contiguous()
    b, c, length = x.shape
    out = x.new_empty((b, 3 * c, length), dtype=torch.bfloat16) if split else torch.empty_like(x)
    if x.numel():
        block = _SHORT_BLOCK if length <= _SHORT_BLOCK else _LONG_BLOCK
        _snake((b * c, cdiv(length, block)),
            x, alpha.reshape(c), alpha if bias is None else bias, out, c, length, SNAKE_EPS, BLOCK=block,
            LIBDEVICE=not _INTERPRETED, HAS_BIAS=bias is not None, SPLIT=split,
            num_warps=1 if block == _SHORT_BLOCK else 4,
            enable_fp_fusion=False)  # x + inv·s² rounded twice, as torch does, not one FMA
    return out


FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def snake_for(device: torch.device | str, dtype: torch.dtype = torch.float32) -> SnakeFn:
    """`snake_triton` on CUDA when Triton is importable and the dtype is one it computes (not
    float64: a float64 reference decode keeps the torch math), the torch reference otherwise."""
    if torch.device(device).type == "cuda" and triton is not None and dtype in FUSED_DTYPES:
        return snake_triton
    return snake


def snake_split_for(device: torch.device | str) -> SplitSnakeFn:
    """`snake_split_triton` on CUDA when Triton is importable, the torch reference otherwise."""
    return snake_split_triton if torch.device(device).type == "cuda" and triton is not None else snake_split
