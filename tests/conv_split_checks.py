"""Checks of the tensor-core residual-unit convs (`codec/conv_split.py`) shared by the interpreted
CPU test and the CUDA test: each against a float64 torch conv, relative to the output's peak."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from higgs_serve.codec.conv_split import LaunchShape, conv1d_tc, tap_major
from higgs_serve.codec.snake import snake

# (channels, taps, dilation, positions): every conv form of a residual unit, and lengths that
# are not a multiple of any block (the masked tail) or shorter than the dilated reach
CASES = [(32, 7, 1, 100), (32, 7, 9, 37), (64, 7, 3, 200), (64, 1, 1, 33), (128, 7, 9, 20), (128, 1, 1, 129)]
# the bound on max |error| / peak: float32-class (cuDNN float32 is ~1e-6 here)
TOLERANCE = {"tf32x3": 5e-6, "bf16x3": 5e-5}


def conv_case(case, device, seed=0):
    c, k, d, t = case
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, c, t, generator=g)
    w = torch.randn(c, c, k, generator=g) / (c * k) ** 0.5
    b = 0.1 * torch.randn(c, generator=g)
    alpha = torch.rand(c, generator=g) + 0.5
    res = torch.randn(3, c, t, generator=g)
    return [v.to(device) for v in (x, w, b, alpha, res)]


def check_conv(case, mode, device, fused: bool, shape: LaunchShape | None = None) -> float:
    """conv1d_tc against float64: plain, or with the Snake prologue and the skip epilogue (`fused`).
    Returns the error relative to the peak."""
    x, w, b, alpha, res = conv_case(case, device)
    _, k, d, _ = case
    tw = tap_major(w, b, mode)
    if fused:
        y = conv1d_tc(x, tw, d, alpha=alpha, residual=res, shape=shape)
        ref = res.double() + F.conv1d(snake(x.double(), alpha.double().reshape(1, -1, 1)), w.double(), b.double(),
                                      padding=d * (k // 2), dilation=d)
    else:
        y = conv1d_tc(x, tw, d, shape=shape)
        ref = F.conv1d(x.double(), w.double(), b.double(), padding=d * (k // 2), dilation=d)
    assert y.shape == ref.shape and y.dtype == torch.float32
    err = ((y.double() - ref).abs().max() / ref.abs().max()).item()
    assert err <= TOLERANCE[mode], f"{mode} {case} fused={fused}: error {err:.2e} of peak"
    return err
