"""The residual units' convolutions (SPEC §1.8) on the tensor cores, at float32-class precision.

The fifteen residual units hold ~75 % of the decoder's arithmetic. In float32 cuDNN runs them on
the CUDA cores (19–39 TFLOP/s on an H200, benchmarks/results/conv_forms_h200.txt); the tensor
cores take TF32 (10 mantissa bits) or bfloat16 (7), which a float32 codec must not lose. Here each
float32 operand is split into a tensor-core "hi" part and the remainder "lo", and three MMAs
(hi·hi + hi·lo + lo·hi, float32 accumulation) recover the product; the dropped lo·lo term is below
2^-16 of it for bf16x3 and 2^-22 for tf32x3. Weights are split once, when the decoder is placed;
activations are split in registers.

`conv1d_tc` is an implicit GEMM: out[b, o, t] = bias[o] + Σ_{j, c} W[j, o, c] · x[b, c, t + (j − K//2)·d],
with W tap-major ([K, C_out, C_in]) so every reduction tile is a plain [C_out, C_in] block, and
the input tile loaded at its tap's shift (zero outside the row: the conv's "same" padding). The k1
conv of a residual unit also takes the unit's second Snake as a prologue on its input tile and the
skip connection as an epilogue (one kernel instead of three passes over the activation); its
Snake does the reference's float32 operations in the reference's order (`codec/snake.py`).

`residual_unit_tc` is the unit built from them; `codec/decoder.py` picks it for float32 on CUDA.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import Tensor

from higgs_serve.codec.snake import SNAKE_EPS, snake_triton

try:
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice

    from higgs_serve.model.launcher import Launcher, cdiv
except ImportError:  # CPU-only installs
    triton = None

MODES = ("tf32x3", "bf16x3")
_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


@dataclass(frozen=True)
class LaunchShape:
    block_out: int  # output channels per program
    block_t: int  # positions per program
    block_in: int  # input channels per reduction step
    num_warps: int
    num_stages: int


# by input channels (the decoder's convs are square); from benchmarks/bench_conv_split.py on an H200
LAUNCH_SHAPES = {
    32: LaunchShape(32, 256, 32, 4, 3),
    64: LaunchShape(64, 128, 32, 4, 3),
}
WIDE_SHAPE = LaunchShape(128, 128, 32, 8, 3)


def launch_shape(channels: int) -> LaunchShape:
    return LAUNCH_SHAPES.get(channels, WIDE_SHAPE)


if triton is not None:

    # Not specialised on T or the dilation: a window length first seen on live traffic must not
    # stall the codec thread on a compile (the start-up warm-up compiles every other variant).
    @triton.jit(do_not_specialize=["T", "dilation"])
    def _conv_tc_kernel(X, ALPHA, W, WLO, BIAS, RES, Y, T, dilation, eps, C: tl.constexpr, CO: tl.constexpr,
                        K: tl.constexpr, SNAKE: tl.constexpr, RESIDUAL: tl.constexpr, MODE: tl.constexpr,
                        LIBDEVICE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        pid_t = tl.program_id(0)
        offs_o = tl.program_id(1) * BM + tl.arange(0, BM)
        b = tl.program_id(2).to(tl.int64)  # B·C·T passes 2**31 elements at large batches
        offs_t = pid_t * BN + tl.arange(0, BN)
        offs_k = tl.arange(0, BK)
        x_row = X + b * C * T
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for j in tl.static_range(K):
            t_in = offs_t + (j - K // 2) * dilation
            t_ok = (t_in >= 0) & (t_in < T)
            for c0 in range(0, C, BK):
                chans = c0 + offs_k
                x = tl.load(x_row + chans[:, None] * T + t_in[None, :], mask=t_ok[None, :], other=0.0)
                if SNAKE:  # x + (1 / (α + eps)) · sin(α·x)², rounded as codec/snake.py rounds it
                    a = tl.load(ALPHA + chans)[:, None]
                    if LIBDEVICE:
                        s = libdevice.sin(a * x)
                    else:
                        s = tl.sin(a * x)
                    x = x + tl.math.div_rn(1.0, a + eps) * (s * s)  # snake(0) = 0: padding stays 0
                w_off = j * CO * C + offs_o[:, None] * C + chans[None, :]
                if MODE == "bf16x3":
                    w_hi = tl.load(W + w_off)
                    w_lo = tl.load(WLO + w_off)
                    x_hi = x.to(tl.bfloat16)
                    x_lo = (x - x_hi.to(tl.float32)).to(tl.bfloat16)
                    acc = tl.dot(w_hi, x_hi, acc)
                    acc = tl.dot(w_hi, x_lo, acc)
                    acc = tl.dot(w_lo, x_hi, acc)
                else:
                    acc = tl.dot(tl.load(W + w_off), x, acc, input_precision="tf32x3")
        y = acc + tl.load(BIAS + offs_o)[:, None]  # conv with bias, then + skip: torch's rounding
        y_off = b * CO * T + offs_o[:, None] * T + offs_t[None, :]
        t_out = (offs_t < T)[None, :]
        if RESIDUAL:
            y = tl.load(RES + y_off, mask=t_out, other=0.0) + y
        tl.store(Y + y_off, y, mask=t_out)

    _conv_tc = Launcher(_conv_tc_kernel)


@dataclass(frozen=True)
class TapMajor:
    """A conv weight [C_out, C_in, K] laid out for `conv1d_tc`: [K, C_out, C_in], float32 for
    tf32x3 (the split happens in the MMA) or its bf16 hi and lo parts for bf16x3."""

    hi: Tensor
    lo: Tensor  # = hi for tf32x3 (unused)
    bias: Tensor
    mode: str

    @property
    def taps(self) -> int:
        return self.hi.shape[0]

    @property
    def channels(self) -> tuple[int, int]:
        return self.hi.shape[2], self.hi.shape[1]  # (in, out)


def tap_major(weight: Tensor, bias: Tensor, mode: str) -> TapMajor:
    if mode not in MODES:
        raise ValueError(f"split mode must be one of {MODES}, got {mode!r}")
    w = weight.detach().float().permute(2, 0, 1).contiguous()
    if mode == "tf32x3":
        return TapMajor(w, w, bias.detach().float().contiguous(), mode)
    hi = w.to(torch.bfloat16)
    return TapMajor(hi, (w - hi.float()).to(torch.bfloat16), bias.detach().float().contiguous(), mode)


def fits(channels_in: int, channels_out: int) -> bool:
    """Whether `conv1d_tc` takes a conv of these widths (every conv of the real codec's residual
    units does; tiny test geometries may not)."""
    shape = launch_shape(channels_in)
    return channels_in % shape.block_in == 0 and channels_out % shape.block_out == 0


def conv1d_tc(x: Tensor, w: TapMajor, dilation: int = 1, alpha: Tensor | None = None,
              residual: Tensor | None = None, shape: LaunchShape | None = None) -> Tensor:
    """[residual +] conv1d([snake_alpha](x), w) with "same" padding: x [B, C_in, T] float32
    (contiguous), alpha [C_in] or None, residual [B, C_out, T] or None -> [B, C_out, T] float32.
    `shape`: the launch shape (default: `launch_shape(C_in)`; benchmarks sweep it)."""
    batch, c_in, length = x.shape
    c_out = w.channels[1]
    shape = shape or launch_shape(c_in)
    if x.dtype != torch.float32 or w.channels[0] != c_in or c_in % shape.block_in or c_out % shape.block_out:
        raise ValueError(f"conv1d_tc: float32 x [B, {w.channels[0]}, T] for a {w.channels} conv, got {x.dtype} "
                         f"{list(x.shape)}")
    x = x.contiguous()
    y = torch.empty(batch, c_out, length, dtype=torch.float32, device=x.device)
    if residual is not None:
        residual = residual.contiguous()
        if residual.shape != y.shape:
            raise ValueError(f"conv1d_tc: residual {list(residual.shape)} != output {list(y.shape)}")
    if y.numel():
        _conv_tc((cdiv(length, shape.block_t), c_out // shape.block_out, batch),
                 x, x if alpha is None else alpha.reshape(c_in), w.hi, w.lo, w.bias,
                 y if residual is None else residual, y, length, dilation, SNAKE_EPS,
                 C=c_in, CO=c_out, K=w.taps, SNAKE=alpha is not None, RESIDUAL=residual is not None, MODE=w.mode,
                 LIBDEVICE=not _INTERPRETED, BM=shape.block_out, BN=shape.block_t, BK=shape.block_in,
                 num_warps=shape.num_warps, num_stages=shape.num_stages,
                 enable_fp_fusion=False)  # the Snake prologue rounds as the reference does
    return y


@dataclass(frozen=True)
class UnitWeights:
    alpha1: Tensor
    conv1: TapMajor  # k7, dilated
    alpha2: Tensor
    conv2: TapMajor  # k1


def unit_weights(w: dict[str, Tensor], prefix: str, mode: str) -> UnitWeights:
    return UnitWeights(w[prefix + ".snake1.alpha"], tap_major(w[prefix + ".conv1.weight"], w[prefix + ".conv1.bias"], mode),
                       w[prefix + ".snake2.alpha"].reshape(-1).contiguous(),
                       tap_major(w[prefix + ".conv2.weight"], w[prefix + ".conv2.bias"], mode))


def residual_unit_tc(x: Tensor, u: UnitWeights, dilation: int) -> Tensor:
    """DAC residual unit x + conv1x1(snake(conv7_dilated(snake(x)))) in three kernels: the first
    Snake, the k7 conv, and the k1 conv with the second Snake and the skip folded in."""
    h = conv1d_tc(snake_triton(x, u.alpha1), u.conv1, dilation)
    return conv1d_tc(h, u.conv2, 1, alpha=u.alpha2, residual=x)
