"""On CUDA: launches through the cached launcher (kernels/launcher.py) give the bits of Triton's own
launch, keep a separately compiled kernel for a misaligned pointer, honour PDL and replay inside a
CUDA graph. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from higgs_serve.kernels import pdl
from higgs_serve.kernels.launcher import Launcher

pytest.importorskip("triton")  # the kernel below exists only where Triton does
from higgs_serve.model.fused_ops import TorchOps, _rms_norm_kernel  # noqa: E402

D, EPS = 2560, 1e-6


@pytest.fixture(autouse=True)
def _restore():
    yield
    pdl.set_enabled(None)


def _norm(launch, x, w):
    out = torch.empty_like(x)
    launch((x.shape[0],), x, w, out, x.stride(0), out.stride(0), EPS, D=D, BLOCK=4096, num_warps=4,
           **pdl.launch_args(x.device))
    return out


def _inputs(rows=3, offset=0):
    g = torch.Generator(device="cuda").manual_seed(offset)
    flat = torch.randn(rows * D + offset, device="cuda", generator=g).to(torch.bfloat16)
    x = flat[offset:].view(rows, D)
    w = torch.randn(D, device="cuda", generator=g).to(torch.bfloat16)
    return x, w


@pytest.mark.parametrize("use_pdl", [False, True])
def test_cached_launches_match_triton_launches(use_pdl):
    pdl.set_enabled(use_pdl)
    launch = Launcher(_rms_norm_kernel)
    plain = lambda grid, *a, **m: _rms_norm_kernel[grid](*a, **m)  # noqa: E731
    for offset in (0, 1, 8, 0, 1):  # 2-byte and 16-byte offsets, then the cached signatures again
        x, w = _inputs(offset=offset)
        got = _norm(launch, x, w)
        assert torch.equal(got, _norm(plain, x, w))
        torch.testing.assert_close(got, TorchOps.rms_norm(x, w, EPS), rtol=0, atol=0.02)
    entries = list(launch._compiled.values())
    assert len(entries) == 2  # aligned (offsets 0 and 8 elements) and 2-byte aligned
    assert entries[0][1] != entries[1][1]  # two kernel functions: alignment is specialized on
    # the C launcher is called directly (no scratch memory), with the kernel's PDL flag
    assert all(type(e[0]).__name__ == "builtin_function_or_method" for e in entries)
    assert all(bool(e[2][1]) == pdl.enabled(torch.device("cuda")) for e in entries)


def test_cached_launch_replays_in_a_cuda_graph():
    launch = Launcher(_rms_norm_kernel)
    x, w = _inputs()
    _norm(launch, x, w)  # first call: Triton's path, remembered
    out = torch.empty_like(x)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out.copy_(_norm(launch, x, w))
    torch.cuda.current_stream().wait_stream(stream)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, _norm(launch, x, w))
