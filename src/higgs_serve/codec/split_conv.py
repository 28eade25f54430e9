"""The codec's residual-unit convolutions at float32-class precision on bf16 tensor cores
(Stage 1 precision "bf16x3").

Why: the decoder is float32 (docs/model.md#codec-geometry) and ~80 % of its arithmetic is the residual units' k7
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
that layout is one plain bf16 GEMM. An earlier try split float32 operands in registers inside a
Triton implicit GEMM and was slower than cuDNN float32 (decoder.py's module doc): the split then
sat between the loads and the MMAs. Units of GEMM_MIN_CHANNELS and more run on cuBLAS over tap
columns (`taps`), narrower ones on `_conv_kernel`, which reads the split operand in place; the
kernel adds the bias and the residual, cuBLAS's output gets them after. Measured on the H200
(benchmarks/results/README.md): 64 windows of 39 frames 29.0 ms against 40.5 in float32, the
first 5-frame window no slower, c = 64 378 against 340 audio s/s.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

try:
    import triton
    import triton.language as tl

    from higgs_serve.kernels.launcher import Launcher, cdiv
except ImportError:  # CPU-only installs
    triton = None

SPLIT_PARTS = 3  # activation blocks [hi; lo; hi], weight blocks [w_hi | w_hi | w_lo]
# From here up cuBLAS over the tap columns beats the Triton implicit GEMM (H200, whole decoder,
# 64 windows of 39 frames: the 512- and 256-channel units took 6.0 ms less than float32 on cuBLAS,
# 4.1 ms less on the Triton kernel, whose few, long programs also cost 0.7 ms at batch 1);
# below it the tap columns' traffic loses to the kernel (benchmarks/results/README.md).
GEMM_MIN_CHANNELS = 256


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
class SplitConv:
    """One convolution's split weight, in the GEMM's layout and in the Triton kernel's."""

    flat: Tensor  # [C_out, 3·C_in·k] bf16, columns (block, channel, tap): `split_weight`
    by_tap: Tensor  # [k, C_out, 3·C_in] bf16: one [C_out, 3·C_in] matrix a tap
    kernel: int

    @classmethod
    def of(cls, weight: Tensor) -> SplitConv:
        c_out, c_in, k = weight.shape
        flat = split_weight(weight)
        return cls(flat, flat.reshape(c_out, SPLIT_PARTS * c_in, k).permute(2, 0, 1).contiguous(), k)


@dataclass(frozen=True)
class SplitUnit:
    """One residual unit's split weights: the k7 dilated conv and the k1 conv."""

    conv7: SplitConv
    bias7: Tensor  # [C] float32
    conv1: SplitConv
    bias1: Tensor  # [C] float32

    @classmethod
    def of(cls, w: dict[str, Tensor], prefix: str) -> SplitUnit:
        return cls(SplitConv.of(w[prefix + ".conv1.weight"]), w[prefix + ".conv1.bias"].float(),
                   SplitConv.of(w[prefix + ".conv2.weight"]), w[prefix + ".conv2.bias"].float())


def taps(x: Tensor, dilation: int, kernel: int = 7) -> Tensor:
    """Activations [B, R, T] -> the k-tap columns [B, R·k, T] of a "same"-padded dilated
    convolution, rows in (row, tap) order: for split activations (block, channel, tap), the
    order of `split_weight`'s columns; for plain ones the order of a conv weight's flattening."""
    batch, rows, length = x.shape
    padded = F.pad(x, (dilation * (kernel // 2),) * 2)
    cols = torch.stack([padded[..., j * dilation : j * dilation + length] for j in range(kernel)], dim=2)
    return cols.reshape(batch, rows * kernel, length)


def matmul_f32(weight: Tensor, cols: Tensor) -> Tensor:
    """weight [M, K] bf16 @ cols [B, K, N] bf16 -> [B, M, N] float32, products summed in float32.
    On CUDA one cuBLAS GEMM that writes float32; elsewhere (no such kernel) the same exact
    products summed in float32 math, which differs only in summation order."""
    if cols.is_cuda:
        return torch.bmm(weight.expand(cols.shape[0], -1, -1), cols, out_dtype=torch.float32)
    return torch.matmul(weight.float(), cols.float())


def conv_split(split: Tensor, conv: SplitConv, dilation: int, bias: Tensor | None = None,
               residual: Tensor | None = None) -> Tensor:
    """A "same"-padded dilated convolution of split activations [B, 3C, T] bf16 -> [B, C_out, T]
    float32 (+ bias [C_out], + residual [B, C_out, T] float32). On CUDA, below GEMM_MIN_CHANNELS
    one Triton implicit GEMM (`_conv_kernel`) where the channels tile (multiples of 32: every
    unit of the real geometry); otherwise `taps` + `matmul_f32` (cuBLAS), the same products."""
    c_out = conv.by_tap.shape[1]
    if split.is_cuda and triton is not None and c_out < GEMM_MIN_CHANNELS and _tiles(split.shape[1], c_out):
        return _conv_triton(split, conv, dilation, bias, residual)
    cols = split if conv.kernel == 1 else taps(split, dilation, conv.kernel)
    y = matmul_f32(conv.flat, cols)
    if bias is not None:
        y.add_(bias[:, None])
    return y if residual is None else y.add_(residual)


if triton is not None:

    # Why an implicit GEMM and not cuBLAS over `taps`: the tap columns cost 42 bytes an element
    # (7 taps x 3 blocks x bf16), written and read again; for the narrow, long activations of the
    # late blocks (32-128 channels, 960 samples a frame) that traffic made the split form slower
    # than cuDNN float32. Here each program reads its [3C, BLOCK_T + 6·dilation] span of the split
    # operand once per tap from L1/L2, and the tap shifts are only addresses.
    @triton.jit(do_not_specialize=["T", "dilation"])
    def _conv_kernel(X, W, Y, BIAS, RES, T, dilation, CI3: tl.constexpr, CO: tl.constexpr, KSIZE: tl.constexpr,
                     HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                     BLOCK_CO: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr):
        b = tl.program_id(0)
        offs_t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
        offs_co = tl.program_id(2) * BLOCK_CO + tl.arange(0, BLOCK_CO)
        offs_k = tl.arange(0, BLOCK_K)
        x_base = X + b.to(tl.int64) * CI3 * T
        acc = tl.zeros((BLOCK_CO, BLOCK_T), dtype=tl.float32)
        for j in tl.static_range(KSIZE):
            t_in = offs_t + (j - KSIZE // 2) * dilation
            t_ok = (t_in >= 0) & (t_in < T)  # the zero padding of a "same" convolution
            for k0 in range(0, CI3, BLOCK_K):
                w = tl.load(W + (j * CO + offs_co[:, None]) * CI3 + k0 + offs_k[None, :])
                x = tl.load(x_base + (k0 + offs_k[:, None]) * T + t_in[None, :], mask=t_ok[None, :], other=0.0)
                acc = tl.dot(w, x, acc)
        t_out = offs_t[None, :] < T
        out = b.to(tl.int64) * CO * T + offs_co[:, None] * T + offs_t[None, :]
        if HAS_BIAS:
            acc += tl.load(BIAS + offs_co)[:, None]
        if HAS_RES:
            acc += tl.load(RES + out, mask=t_out, other=0.0)
        tl.store(Y + out, acc, mask=t_out)

    _conv = Launcher(_conv_kernel)


_BLOCK_T = 128


def _blocks(ci3: int, c_out: int) -> tuple[int, int]:
    """(BLOCK_CO, BLOCK_K) for a conv of ci3 split input and c_out output channels."""
    return min(c_out, 64), 64 if ci3 % 64 == 0 else 32


def _tiles(ci3: int, c_out: int) -> bool:
    block_co, block_k = _blocks(ci3, c_out)
    return block_co >= 16 and c_out % block_co == 0 and ci3 % block_k == 0


def _conv_triton(split: Tensor, conv: SplitConv, dilation: int, bias: Tensor | None,
                 residual: Tensor | None) -> Tensor:
    batch, ci3, length = split.shape
    c_out = conv.by_tap.shape[1]
    block_co, block_k = _blocks(ci3, c_out)
    split = split.contiguous()
    residual = None if residual is None else residual.contiguous()
    out = torch.empty((batch, c_out, length), dtype=torch.float32, device=split.device)
    if out.numel():
        _conv((batch, cdiv(length, _BLOCK_T), c_out // block_co),
              split, conv.by_tap, out, out if bias is None else bias, out if residual is None else residual,
              length, dilation, CI3=ci3, CO=c_out, KSIZE=conv.kernel, HAS_BIAS=bias is not None,
              HAS_RES=residual is not None, BLOCK_CO=block_co, BLOCK_T=_BLOCK_T, BLOCK_K=block_k,
              num_warps=4, num_stages=3)
    return out
