"""The residual units' convolutions (SPEC §1.8), float32 on tensor cores.

Fifteen residual units hold ~75 % of the decoder's arithmetic: a k7 dilated conv and a k1 conv
each, at 512 down to 32 channels over up to 24,000 samples a second of audio. In float32 cuDNN
runs them on the CUDA cores (tensor cores take TF32, 10 mantissa bits, which the SPEC does not
allow by default). `conv1d_triton` is an implicit GEMM on the tensor cores with Triton's "tf32x3"
dot: each float32 operand is split into a TF32 high part and a TF32 remainder and three MMAs
(hi·hi + hi·lo + lo·hi) recover the product to about float32's precision (the dropped lo·lo term
is below 2^-22 of it), with float32 accumulation. The reduction runs over (input channel, tap)
pairs, so the weight [C_out, C_in, K] is read as the contiguous matrix [C_out, C_in·K] and the
input tile is gathered at t + k·dilation − padding (zero outside the row). Bias and the residual
unit's skip connection are added in the epilogue, rounded where the torch math rounds them: conv
with bias, then + x.

Where torch's TF32 switch for convolutions (`torch.backends.cudnn.allow_tf32`) is on, as it is
for the `tf32` codec precision, the kernel uses one TF32 MMA, as cuDNN would.

`conv1d` (F.conv1d) is the reference and the CPU path; `conv_for(device, dtype)` picks once.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs
    triton = None

BLOCK_R = 32  # reduction tile: every residual-unit conv has C_in a multiple of 32
BLOCK_T = 128
BACKENDS = ("cudnn", "triton")
_override: str | None = None


class ConvFn(Protocol):
    def __call__(self, x: Tensor, weight: Tensor, bias: Tensor, dilation: int = 1, padding: int = 0,
                 residual: Tensor | None = None) -> Tensor: ...


def conv1d(x: Tensor, weight: Tensor, bias: Tensor, dilation: int = 1, padding: int = 0,
           residual: Tensor | None = None) -> Tensor:
    """Reference: residual + conv1d(x [B, C_in, T], weight [C_out, C_in, K], bias), stride 1."""
    y = F.conv1d(x, weight, bias, padding=padding, dilation=dilation)
    return y if residual is None else residual + y


if triton is not None:

    @triton.jit(do_not_specialize=["T_in", "T_out", "dilation", "padding"])
    def _conv1d_kernel(X, W, BIAS, RES, Y, T_in, T_out, dilation, padding, C_IN: tl.constexpr,
                       C_OUT: tl.constexpr, K: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                       PRECISION: tl.constexpr, BLOCK_CO: tl.constexpr, BLOCK_R: tl.constexpr,
                       BLOCK_T: tl.constexpr):
        pid_t = tl.program_id(0)
        offs_co = tl.program_id(1) * BLOCK_CO + tl.arange(0, BLOCK_CO)
        b = tl.program_id(2).to(tl.int64)  # B·C·T passes 2**31 elements at large batches
        offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
        offs_r = tl.arange(0, BLOCK_R)
        x_row = X + b * C_IN * T_in
        w_ptrs = W + offs_co[:, None] * (C_IN * K) + offs_r[None, :]  # [BLOCK_CO, BLOCK_R]
        acc = tl.zeros((BLOCK_CO, BLOCK_T), dtype=tl.float32)
        for r0 in range(0, C_IN * K, BLOCK_R):
            r = r0 + offs_r  # (input channel, tap) = (r // K, r % K)
            t_in = offs_t[None, :] + ((r % K) * dilation - padding)[:, None]  # [BLOCK_R, BLOCK_T]
            x = tl.load(x_row + (r // K)[:, None] * T_in + t_in, mask=(t_in >= 0) & (t_in < T_in), other=0.0)
            acc = tl.dot(tl.load(w_ptrs), x, acc, input_precision=PRECISION)
            w_ptrs += BLOCK_R
        acc += tl.load(BIAS + offs_co)[:, None]
        t_ok = offs_t[None, :] < T_out
        y_off = b * C_OUT * T_out + offs_co[:, None] * T_out + offs_t[None, :]
        if HAS_RESIDUAL:
            acc += tl.load(RES + y_off, mask=t_ok, other=0.0)
        tl.store(Y + y_off, acc, mask=t_ok)


def conv1d_triton(x: Tensor, weight: Tensor, bias: Tensor, dilation: int = 1, padding: int = 0,
                  residual: Tensor | None = None) -> Tensor:
    """`conv1d` as a tensor-core implicit GEMM: float32 x [B, C_in, T], weight [C_out, C_in, K]
    (C_in a multiple of 32, C_out of 16), bias [C_out], optional residual [B, C_out, T_out]."""
    b, c_in, t_in = x.shape
    c_out, c_in_w, k = weight.shape
    if c_in_w != c_in or not fits(x, weight):
        raise ValueError(f"conv1d_triton: float32 x [B, C_in, T] and weight [C_out, C_in, K] with C_in % {BLOCK_R} "
                         f"== 0 and C_out % 16 == 0, got {x.dtype} {list(x.shape)} and {list(weight.shape)}")
    t_out = t_in + 2 * padding - dilation * (k - 1)
    x, weight = x.contiguous(), weight.contiguous()
    y = torch.empty(b, c_out, t_out, dtype=x.dtype, device=x.device)
    if residual is not None:
        residual = residual.contiguous()
        if residual.shape != y.shape:
            raise ValueError(f"conv1d_triton: residual {list(residual.shape)} != output {list(y.shape)}")
    if y.numel():
        block_co = next(bc for bc in (64, 32, 16) if c_out % bc == 0)
        precision = "tf32" if torch.backends.cudnn.allow_tf32 else "tf32x3"
        _conv1d_kernel[(triton.cdiv(t_out, BLOCK_T), c_out // block_co, b)](
            x, weight, bias, y if residual is None else residual, y, t_in, t_out, dilation, padding,
            C_IN=c_in, C_OUT=c_out, K=k, HAS_RESIDUAL=residual is not None, PRECISION=precision,
            BLOCK_CO=block_co, BLOCK_R=BLOCK_R, BLOCK_T=BLOCK_T, num_warps=4, num_stages=3)
    return y


def fits(x: Tensor, weight: Tensor) -> bool:
    """Whether conv1d_triton takes this conv (the real codec's residual units all fit; tiny test
    geometries may not)."""
    return x.dtype == torch.float32 and weight.shape[1] % BLOCK_R == 0 and weight.shape[0] % 16 == 0


def conv1d_fast(x: Tensor, weight: Tensor, bias: Tensor, dilation: int = 1, padding: int = 0,
                residual: Tensor | None = None) -> Tensor:
    """conv1d_triton where the shapes fit it, the reference elsewhere."""
    kernel = conv1d_triton if fits(x, weight) else conv1d
    return kernel(x, weight, bias, dilation, padding, residual)


def set_backend(name: str | None) -> None:
    """Force cuDNN or the Triton kernel for decoders moved from now on (None: `conv_for` decides).
    For benchmarks that compare the two."""
    global _override
    if name is not None and name not in BACKENDS:
        raise ValueError(f"conv backend must be one of {BACKENDS}, got {name!r}")
    _override = name


def conv_for(device: torch.device | str, dtype: torch.dtype = torch.float32) -> ConvFn:
    """`conv1d_fast` for float32 on CUDA when Triton is importable (bfloat16/float16 convs are
    on the tensor cores in cuDNN already), the reference otherwise."""
    fast = torch.device(device).type == "cuda" and triton is not None and dtype == torch.float32
    if fast and _override != "cudnn":
        return conv1d_fast
    return conv1d
