"""Checks shared by the residual-unit convolution tests: on CUDA (tests/gpu) and under Triton's
interpreter on CPU (tests/unit, only when TRITON_INTERPRET=1 was set before the run started)."""

from __future__ import annotations

import torch

from higgs_serve.codec.conv import conv1d, conv1d_triton

# (B, C_in, C_out, T, K, dilation): the decoder's k7 convs (dilations 1, 3, 9, padding 3·d) and
# k1 convs, rows shorter than the kernel's reach, a ragged tail past one 128-sample tile.
SHAPES = [(1, 32, 32, 5, 7, 1), (2, 64, 32, 130, 7, 9), (1, 32, 64, 300, 1, 1), (3, 128, 128, 40, 7, 3),
          (2, 64, 16, 257, 7, 3)]


def inputs(shape, device, seed=0):
    b, c_in, c_out, t, k, _ = shape
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, c_in, t, generator=g)
    w = torch.randn(c_out, c_in, k, generator=g) * (c_in * k) ** -0.5
    bias = torch.randn(c_out, generator=g)
    return x.to(device), w.to(device), bias.to(device)


def check_conv(shape, device, residual: bool, rtol: float) -> None:
    """Against the float64 reference, to rtol of the products' magnitude (|w|·|x| summed), which is
    what bounds any float32 summation order."""
    x, w, bias = inputs(shape, device)
    dilation, k = shape[5], shape[4]
    pad = dilation * (k - 1) // 2
    t_out = x.shape[-1] + 2 * pad - dilation * (k - 1)
    res = torch.randn(x.shape[0], w.shape[0], t_out, device=device) if residual else None
    got = conv1d_triton(x, w, bias, dilation, pad, residual=res)
    ref = conv1d(x.double(), w.double(), bias.double(), dilation, pad, None if res is None else res.double())
    scale = conv1d(x.double().abs(), w.double().abs(), bias.double().abs(), dilation, pad)
    if res is not None:
        scale = scale + res.double().abs()
    assert got.shape == ref.shape and got.dtype == torch.float32
    err = (got.double() - ref).abs()
    assert torch.all(err <= rtol * scale + 1e-30), f"max err / scale {(err / scale).max().item():.3e}"
