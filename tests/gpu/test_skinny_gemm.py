"""The skinny decode GEMM on CUDA: equal to a float32 reference within bf16 rounding for every
4B decode shape and row count the engine sends it, with and without the residual; a row's result
does not depend on its bucket-mates; the engine's ops route exactly the decode GEMMs to it.
Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from higgs_serve.model.fused_ops import CublasOps, TritonOps, gemm_row_blocks
from higgs_serve.model.skinny_gemm import SkinnyConfig, config_for, default_config, skinny_linear, swiglu_config

SHAPES_4B = {"qkv": (6144, 2560), "o": (2560, 4096), "gate_up": (19456, 2560), "down": (2560, 9728)}


def _data(m: int, n: int, k: int, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=g) * k ** -0.5).to(torch.bfloat16)
    r = torch.randn(m, n, device="cuda", generator=g).to(torch.bfloat16)
    return x, w, r


def _assert_close_to_fp32(y: torch.Tensor, ref: torch.Tensor) -> None:
    # one bf16 rounding of the result (2^-8 relative) plus float32 accumulation-order noise
    err = (y.float() - ref).abs()
    assert torch.all(err <= ref.abs() * 2 ** -7 + 1e-2), f"max err {err.max().item():.3e}"


@pytest.mark.parametrize("name", sorted(SHAPES_4B))
@pytest.mark.parametrize("m", [1, 5, 16, 17, 32, 40, 64])
@pytest.mark.parametrize("residual", [False, True])
def test_matches_fp32_reference(name, m, residual):
    n, k = SHAPES_4B[name]
    x, w, r = _data(m, n, k)
    cfg = config_for(m, n, k, torch.cuda.get_device_properties(0).multi_processor_count)
    assert cfg is not None  # every 4B decode GEMM up to 64 rows has a measured shape
    y = skinny_linear(x, w, r if residual else None, cfg)
    ref = x.float() @ w.float().t() + (r.float() if residual else 0)
    _assert_close_to_fp32(y, ref)


@pytest.mark.parametrize("cfg", [SkinnyConfig(32, 256, 1), SkinnyConfig(64, 64, 16, num_stages=3),
                                 SkinnyConfig(128, 128, 2, num_warps=8)])
@pytest.mark.parametrize("m", [9, 64])
def test_other_launch_shapes_and_row_buckets_agree(cfg, m):
    n, k = 2560, 4096
    x, w, r = _data(m, n, k, seed=1)
    _assert_close_to_fp32(skinny_linear(x, w, r, cfg), x.float() @ w.float().t() + r.float())


@pytest.mark.parametrize("m", [1, 16, 64])
def test_first_principles_config_agrees(m):
    n, k = SHAPES_4B["down"]
    x, w, r = _data(m, n, k, seed=4)
    cfg = default_config(m, n, k, torch.cuda.get_device_properties(0).multi_processor_count)
    _assert_close_to_fp32(skinny_linear(x, w, r, cfg), x.float() @ w.float().t() + r.float())


def test_ops_send_decode_gemms_to_the_kernel_and_the_rest_to_cublas():
    n, k = SHAPES_4B["o"]
    x, w, r = _data(65, n, k)
    assert TritonOps._skinny(x[:16], w) is not None
    assert TritonOps._skinny(x[:64], w) is not None  # a measured 64-row bucket
    assert TritonOps._skinny(x, w) is None  # past MAX_ROWS: cuBLAS
    assert TritonOps._skinny(x[:64], torch.empty(6144, 2560, device="cuda", dtype=w.dtype)) is not None  # qkv too
    assert TritonOps._skinny(x[:64], torch.empty(4096, 4096, device="cuda", dtype=w.dtype)) is None  # unmeasured
    assert TritonOps._skinny(x[:16].float(), w.float()) is None  # float32 stays exact on cuBLAS
    assert CublasOps._skinny(x[:16], w) is None
    x, r = x[:16], r[:16]
    skinny = TritonOps.linear_residual(x, w, r)
    cublas = CublasOps.linear_residual(x, w, r)
    ref = x.float() @ w.float().t() + r.float()
    _assert_close_to_fp32(skinny, ref)
    _assert_close_to_fp32(cublas, ref)
    _assert_close_to_fp32(TritonOps.linear(x, w), x.float() @ w.float().t())


@pytest.mark.parametrize("m", [72, 96, 128])
def test_eager_row_blocks_are_the_skinny_kernel_on_each_block(m):
    """Inside gemm_row_blocks (the runner's eager steps) a GEMM of 65-128 rows runs as blocks of
    64 rows or fewer on the skinny kernel: each block's rows are what that block alone gives, bit
    for bit, for all three GEMM forms; outside, the same GEMM stays one cuBLAS call."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    blocks = [(0, 64), (64, m)]
    for name in ("qkv", "o", "gate_up", "down"):
        n, k = SHAPES_4B[name]
        x, w, r = _data(m, n, k, seed=6)
        assert TritonOps._skinny(x, w) is None
        with gemm_row_blocks(128):
            assert [b[:2] for b in TritonOps._skinny(x, w)] == blocks
            plain, residual = TritonOps.linear(x, w), TritonOps.linear_residual(x, w, r)
            swiglu = TritonOps.linear_silu_mul(x, w) if name == "gate_up" else None
        for start, end in blocks:
            cfg = config_for(end - start, n, k, sms)
            rows = slice(start, end)
            assert torch.equal(plain[rows], skinny_linear(x[rows], w, None, cfg))
            assert torch.equal(residual[rows], skinny_linear(x[rows], w, r[rows], cfg))
            if swiglu is not None:
                assert torch.equal(swiglu[rows], skinny_linear(x[rows], w, None, swiglu_config(cfg, n, k), swiglu=True))
        _assert_close_to_fp32(residual, x.float() @ w.float().t() + r.float())


@pytest.mark.parametrize("m", [1, 5, 16, 24, 64])
def test_swiglu_epilogue_matches_the_two_kernels(m):
    n, k = SHAPES_4B["gate_up"]
    x, w, _ = _data(m, n, k, seed=5)
    cfg = config_for(m, n, k, torch.cuda.get_device_properties(0).multi_processor_count)
    fused = skinny_linear(x, w, None, swiglu_config(cfg, n, k), swiglu=True)
    two_kernels = TritonOps.silu_mul(skinny_linear(x, w, None, cfg))
    assert fused.shape == (m, n // 2)
    # the same roundings (test below: the same bits); at most an ulp (2^-8) of gate, up or the
    # activation apart should a compiler order the float32 sums differently
    err = (fused.float() - two_kernels.float()).abs()
    assert torch.all(err <= two_kernels.float().abs() * 2 ** -6 + 1e-3), f"max err {err.max().item():.3e}"
    gate_up = x.float() @ w.float().t()
    ref = torch.nn.functional.silu(gate_up[:, :n // 2]) * gate_up[:, n // 2:]
    err = (fused.float() - ref).abs()  # four bf16 roundings (gate, up, activation, product)
    assert torch.all(err <= ref.abs() * 2 ** -6 + 1e-2), f"max err {err.max().item():.3e}"
    assert torch.equal(TritonOps.linear_silu_mul(x, w), fused)  # the ops route decode rows to it
    assert torch.equal(CublasOps.linear_silu_mul(x, w), CublasOps.silu_mul(CublasOps.linear(x, w)))


@pytest.mark.parametrize("m", [1, 16, 64])
def test_swiglu_epilogue_gives_the_two_kernels_bits(m):
    # the gate and up tiles are the plain GEMM's tile, so each sum runs in the same order
    n, k = SHAPES_4B["gate_up"]
    x, w, _ = _data(m, n, k, seed=6)
    cfg = config_for(m, n, k, torch.cuda.get_device_properties(0).multi_processor_count)
    fused = skinny_linear(x, w, None, swiglu_config(cfg, n, k), swiglu=True)
    assert torch.equal(fused, TritonOps.silu_mul(skinny_linear(x, w, None, cfg)))


def test_capturable_in_a_cuda_graph():
    n, k = SHAPES_4B["down"]
    x, w, r = _data(4, n, k, seed=3)
    cfg = config_for(4, n, k, torch.cuda.get_device_properties(0).multi_processor_count)
    eager = skinny_linear(x, w, r, cfg)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        skinny_linear(x, w, r, cfg)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = skinny_linear(x, w, r, cfg)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


@pytest.mark.parametrize("name", ["o", "down"])
@pytest.mark.parametrize("m", [1, 16, 64])
def test_residual_sum_in_place_gives_the_same_bits(name, m):
    """linear_residual(x, w, h, out=h), as the backbone calls it from its second sum on, writes
    what the out-of-place call returns: the skinny kernel (each program reads its residual tile
    before writing it) and cuBLAS's addmm (no copy of the residual first) alike."""
    n, k = SHAPES_4B[name]
    x, w, r = _data(m, n, k, seed=6)
    for ops in (TritonOps, CublasOps):
        want = ops.linear_residual(x, w, r)
        h = r.clone()
        got = ops.linear_residual(x, w, h, out=h)
        assert got.data_ptr() == h.data_ptr()
        assert torch.equal(got, want), ops.name
