"""The codec's residual-unit convolutions at float32-class precision on bf16 tensor cores
(Stage 1 precision "bf16x3").

Why: the decoder is float32 (SPEC §1.8) and ~80 % of its arithmetic is the residual units' k7
and k1 convolutions, which cuDNN and cuBLAS run on the float32 SIMT units (19–39 TFLOP/s on an
H200). A float32 x is hi + lo with hi = bf16(x) and lo = bf16(x − hi), to ~2^-17 of x; so is a
weight, and w·x ≈ w_hi·x_hi + w_hi·x_lo + w_lo·x_hi (the dropped w_lo·x_lo is ~2^-16 of the
product). Each of those products is exact in float32 and the tensor cores sum them in float32,
so one bf16 GEMM over three times the reduction length, written out in float32 (torch's
`out_dtype`), gives the convolution to ~1e-5 relative: under half a 16-bit PCM step at full
scale, against TF32's ~2e-3.

The split happens where the operands are made, not in the GEMM: the weights once at load
(`SplitUnit.of`), the activations by the Snake that feeds each convolution, which writes them
as three channel blocks [hi; lo; hi] (`snake.snake_split`) so that [w_hi | w_hi | w_lo] against
that layout is one plain GEMM. A convolution's bias is added by whatever reads its output next
(the second Snake, or the residual sum), so the GEMM has no epilogue. An earlier try split the
operands in registers inside a Triton implicit GEMM and was slower than cuDNN float32
(decoder.py's module doc): the split then sits between the loads and the MMAs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

SPLIT_PARTS = 3  # activation blocks [hi; lo; hi], weight blocks [w_hi | w_hi | w_lo]


def split_bf16(x: Tensor) -> tuple[Tensor, Tensor]:
    """float32 x -> (hi, lo) bf16 with hi + lo = x to ~2^-17 relative (x − hi is exact in float32)."""
    hi = x.to(torch.bfloat16)
    return hi, (x - hi.float()).to(torch.bfloat16)


def split_weight(weight: Tensor) -> Tensor:
    """Conv weight [C_out, C_in, k] float -> [C_out, 3·C_in·k] bf16 = [w_hi | w_hi | w_lo], its
    columns in the order of `taps` rows: (block, input channel, tap)."""
    hi, lo = split_bf16(weight.float().reshape(weight.shape[0], -1))
    return torch.cat([hi, hi, lo], dim=1).contiguous()


@dataclass(frozen=True)
class SplitUnit:
    """One residual unit's split weights: the k7 dilated conv and the k1 conv."""

    conv7: Tensor  # [C, 3·C·7] bf16
    bias7: Tensor  # [C] float32
    conv1: Tensor  # [C, 3·C] bf16
    bias1: Tensor  # [C] float32

    @classmethod
    def of(cls, w: dict[str, Tensor], prefix: str) -> SplitUnit:
        return cls(split_weight(w[prefix + ".conv1.weight"]), w[prefix + ".conv1.bias"].float(),
                   split_weight(w[prefix + ".conv2.weight"]), w[prefix + ".conv2.bias"].float())


def taps(split: Tensor, dilation: int, kernel: int = 7) -> Tensor:
    """Split activations [B, 3C, T] bf16 -> the k-tap columns [B, 3C·k, T] of a "same"-padded
    dilated convolution, rows in (block, channel, tap) order."""
    batch, rows, length = split.shape
    padded = F.pad(split, (dilation * (kernel // 2),) * 2)
    cols = torch.stack([padded[..., j * dilation : j * dilation + length] for j in range(kernel)], dim=2)
    return cols.reshape(batch, rows * kernel, length)


def matmul_f32(weight: Tensor, cols: Tensor) -> Tensor:
    """weight [M, K] bf16 @ cols [B, K, N] bf16 -> [B, M, N] float32, products summed in float32.
    On CUDA one cuBLAS GEMM that writes float32; elsewhere (no such kernel) the same exact
    products summed in float32 math, which differs only in summation order."""
    if cols.is_cuda:
        return torch.bmm(weight.expand(cols.shape[0], -1, -1), cols, out_dtype=torch.float32)
    return torch.matmul(weight.float(), cols.float())
