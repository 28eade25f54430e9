"""Skinny GEMM for decode steps: y = x @ Wᵀ (+ residual) for a few rows x [M, K] (M ≤ 16) and a
large weight W [N, K].

A decode step multiplies a handful of rows by 7.3 GB of weights: it is a weight read. For these
shapes cuBLAS picks kernels that reach 50–80 % of copy bandwidth on an H200 (the o and down
projections are the worst: 2560 output rows leave too few tiles to keep every SM streaming; see
benchmarks/results/profile_step_h200.txt). This kernel swaps the operands, so W is the tall side of
the MMA and the rows the narrow side, and splits K when N alone gives too few programs. Split
partials go to a float32 workspace that one small kernel sums, adds the residual to and rounds
once, as addmm does (float32 accumulation, one rounding of residual + product). For the MLP's
[gate; up] weight the program can also multiply the up rows matching its gate rows and store
silu(gate) * up (`swiglu=True`): one kernel and one [M, 2I] round trip less a layer.

Tried and dropped (measured on an H200, benchmarks/results/README.md): folding the RMSNorm before
qkv / gate_up and the SiLU-and-multiply before down into this kernel's loads. Computing the dot's
narrow operand in registers instead of loading it cost more than the three kernels it saved: the
decode step at B = 1 went from 3.27 ms (separate kernels) to 4.55 ms. Also dropped: the split-K
reduce adding the residual and then normalising the row for the next GEMM (one kernel instead of
the reduce and the RMSNorm, bit-equal to them). The norm needs the whole row in one program, so
the reduce ran on one program per row instead of five, and that cost what the saved launch
gained: full decode graph at B = 1 2.95 → 3.02 ms GPU time, B = 16 3.26 → 3.34
(step_reduce_norm_*_h200.json). Also dropped: eager GEMMs of 17-64 rows on this kernel (for host
time; captured ones on cuBLAS). The low-latency eager prefill did not move (TTFA 43.9 against
43.4 / 43.7 ms in one call), and a split-K launch pair is no cheaper on the host than cuBLAS
(53.6 us for the o GEMM's pair against 19.6 us for F.linear, launch_overhead_fae6e58_h200.txt,
before the launcher called Triton's C launcher directly).
If it comes back: a graph's warm-up must choose the GEMMs its capture records, or cuBLAS's first
call on the capture stream lands inside the capture and invalidates it (seen on the H200).
Also dropped (H200, benchmarks/results/README.md): the split-K partials summed by each tile's
last-arriving program (an arrival counter, the same bits) instead of the reduce kernel: the atomic
and the re-read at the GEMM's end cost what the launch saved (full graph B = 1 2.76-2.94 -> 2.91 ms
GPU, B = 16 3.07-3.23 -> 3.26); and captured 17-64-row GEMMs on the 16-row launch shapes: 0.1 ms
faster at 32 rows, slower at 48 and 64, with or without moving only gate_up and its SwiGLU
epilogue. What those shapes lacked at 64 rows was occupancy: the [K, 64] x tile doubles a
stage's shared memory, so a 128-deep K tile in 3-5 stages left one or two programs per SM and
gate_up's 304 tiles ran in uneven waves. A wider sweep (64-deep K tiles, 4 stages: three
programs per SM) found launch shapes that beat cuBLAS at 32 and 64 rows for o, gate_up (with the
SwiGLU epilogue) and down; qkv stays on cuBLAS there (benchmarks/results/README.md).

`SkinnyConfig` is a launch shape; `config_for` picks one per (M, N, K) from a table measured with
benchmarks/step/bench_gemm.py, or returns None when the kernel's divisibility rules are not met (the
caller then uses cuBLAS). Rows of x never interact, and the config depends on M only through its
bucket, so a row's result does not depend on the other rows of its bucket.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl

    from higgs_serve.kernels.pdl import pdl_release, pdl_wait
except ImportError:  # CPU-only installs
    triton = None

from higgs_serve.kernels import pdl
from higgs_serve.kernels.launcher import Launcher, next_pow2

# Rows the kernel serves for any shape it divides (default_config): 3-23 % faster than cuBLAS per
# GEMM at 1-16 rows on an H200. From there to MAX_ROWS only the (N, K) with a measured TUNED
# bucket: 10-30 % faster for o, gate_up and down of the 4B talker. For qkv cuBLAS's tensor-core
# tiles are as fast at 32 rows and 1.6 us faster at 64, but a cuBLAS call cannot go on a launch
# tape (kernels/launch_tape.py), and the eager decode steps of 17-64 requests are host-bound by
# far more than that: qkv takes the kernel's best measured shapes there too.
SMALL_ROWS = 16
MAX_ROWS = 64


@dataclass(frozen=True)
class SkinnyConfig:
    block_n: int  # rows of W per program (the MMA's tall side)
    block_k: int
    split_k: int  # programs along K; > 1 adds the float32 workspace and a reduce kernel
    num_warps: int = 4
    num_stages: int = 4

    def fits(self, n: int, k: int) -> bool:
        return n % self.block_n == 0 and k % (self.split_k * self.block_k) == 0


def row_block(m: int) -> int:
    """The MMA's narrow side for m rows: a power of two, at least 16 (tl.dot's minimum)."""
    return max(16, next_pow2(m))


# Measured on one H200 (benchmarks/step/bench_gemm.py, results in benchmarks/results/gemm_h200.json):
# per (N, K) of the 4B talker, per row bucket (largest M the entry serves), the fastest config.
# Buckets above 16 rows from a wider sweep (benchmarks/results/sweep_gemm_rows64_h200.json; us at
# 32 / 64 rows): the 16-row shapes at 1 row; gate_up's entry also serves its SwiGLU epilogue
# (swiglu_config), 27.1 / 28.1 us against 32.6 / 33.8 for cuBLAS and the SiLU-and-multiply kernel.
# o runs eagerly in the high-throughput profile (a split-K pair of launches instead of one addmm);
# taking o's buckets out did not change that profile's A/B (results README), so they stay.
TUNED: dict[tuple[int, int], tuple[tuple[int, SkinnyConfig], ...]] = {
    (6144, 2560): ((16, SkinnyConfig(32, 128, 1, num_stages=5)),  # qkv: 10.7 us, cuBLAS 11.0
                   (32, SkinnyConfig(64, 128, 4, num_stages=3)),  # 11.2 us, cuBLAS 11.3
                   (64, SkinnyConfig(64, 64, 4, num_stages=4))),  # 12.9 us, cuBLAS 11.3
    (2560, 4096): ((16, SkinnyConfig(64, 128, 8, num_stages=3)),  # o: 8.9 us, cuBLAS 11.5
                   (32, SkinnyConfig(64, 128, 4, num_stages=4)),  # 8.6 us, cuBLAS 12.2
                   (64, SkinnyConfig(64, 128, 4, num_stages=3))),  # 10.0 us, cuBLAS 11.2
    (19456, 2560): ((16, SkinnyConfig(64, 128, 1, num_stages=3)),  # gate_up: 24.8 us, cuBLAS 28.7
                    (64, SkinnyConfig(64, 64, 1, num_stages=4))),  # 26.5 / 27.7 us, cuBLAS 30.4 / 31.2
    (2560, 9728): ((16, SkinnyConfig(64, 128, 4, num_stages=5)),  # down: 16.2 us, cuBLAS 19.2
                   (32, SkinnyConfig(64, 128, 4, num_stages=4)),  # 16.5 us, cuBLAS 20.1
                   (64, SkinnyConfig(64, 128, 4, num_stages=3))),  # 18.6 us, cuBLAS 20.8
}


def default_config(m: int, n: int, k: int, num_sms: int) -> SkinnyConfig | None:
    """A launch shape from first principles: 64-row W tiles, and K split (halving the K block
    where K's factors run out) until there are two programs per SM, as the weight stream needs
    many loads in flight on every SM."""
    block_n, block_k, split = 64, 128, 1
    if n % block_n or k % 32:
        return None
    while k % block_k:
        block_k //= 2
    while (n // block_n) * split < 2 * num_sms and split < 16:
        if k % (2 * split * block_k) == 0:
            split *= 2
        elif block_k > 32:
            block_k //= 2
        else:
            break
    return SkinnyConfig(block_n, block_k, split)


@functools.lru_cache(maxsize=4096)  # eager steps ask ~150 times a step for a few shapes
def config_for(m: int, n: int, k: int, num_sms: int) -> SkinnyConfig | None:
    """The config for m rows against W [n, k], or None where the kernel does not apply (cuBLAS):
    past MAX_ROWS, and past SMALL_ROWS for shapes without a measured bucket."""
    if not 1 <= m <= MAX_ROWS:
        return None
    for max_m, cfg in TUNED.get((n, k), ()):
        if m <= max_m and cfg.fits(n, k):
            return cfg
    return default_config(m, n, k, num_sms) if m <= SMALL_ROWS else None


if triton is not None:

    @triton.jit(do_not_specialize=["M"])
    def _skinny_kernel(X, W, Y, R, WS, M, stride_x, stride_y, stride_r,
                       N: tl.constexpr, K: tl.constexpr, SPLIT_K: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                       SWIGLU: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       USE_PDL: tl.constexpr):
        # SWIGLU: W is [gate; up], 2N rows; the program multiplies gate rows offs_n and up rows
        # N + offs_n and stores silu(gate) * up [M, N] (SPLIT_K 1), rounding as _silu_mul_kernel
        # rounds the separate GEMM's output
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        k_span: tl.constexpr = K // SPLIT_K
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        pdl_wait(USE_PDL)
        offs_m = tl.arange(0, BLOCK_M)
        row_ok = offs_m[None, :] < M
        offs_k = pid_k * k_span + tl.arange(0, BLOCK_K)
        w_ptrs = W + offs_n[:, None] * K + offs_k[None, :]  # [BLOCK_N, BLOCK_K], W is contiguous
        x_ptrs = X + offs_m[None, :] * stride_x + offs_k[:, None]  # [BLOCK_K, BLOCK_M]: xᵀ
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for _ in range(k_span // BLOCK_K):
            w = tl.load(w_ptrs)
            x = tl.load(x_ptrs, mask=row_ok, other=0.0)
            acc = tl.dot(w, x, acc)
            if SWIGLU:
                acc_up = tl.dot(tl.load(w_ptrs + N * K), x, acc_up)
            w_ptrs += BLOCK_K
            x_ptrs += BLOCK_K
        pdl_release(USE_PDL)
        if SWIGLU:
            dtype = Y.dtype.element_ty
            gate = acc.to(dtype).to(tl.float32)
            act = (gate / (1.0 + tl.exp(-gate))).to(dtype)
            out = (act.to(tl.float32) * acc_up.to(dtype).to(tl.float32)).to(dtype)
            tl.store(Y + offs_m[None, :] * stride_y + offs_n[:, None], out, mask=row_ok)
        elif SPLIT_K == 1:
            if HAS_RESIDUAL:
                r = tl.load(R + offs_m[None, :] * stride_r + offs_n[:, None], mask=row_ok, other=0.0)
                acc += r.to(tl.float32)
            tl.store(Y + offs_m[None, :] * stride_y + offs_n[:, None], acc.to(Y.dtype.element_ty), mask=row_ok)
        else:  # partial sums: WS [SPLIT_K, BLOCK_M, N] float32
            tl.store(WS + (pid_k * BLOCK_M + offs_m[None, :]) * N + offs_n[:, None], acc, mask=row_ok)

    @triton.jit(do_not_specialize=["M"])
    def _split_reduce_kernel(WS, Y, R, M, stride_y, stride_r, N: tl.constexpr, SPLIT_K: tl.constexpr,
                             HAS_RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK: tl.constexpr,
                             USE_PDL: tl.constexpr):
        pdl_wait(USE_PDL)
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for s in range(SPLIT_K):  # a fixed order: the sum does not depend on timing
            acc += tl.load(WS + (s * BLOCK_M + row) * N + cols)
        pdl_release(USE_PDL)
        if HAS_RESIDUAL:
            acc += tl.load(R + row * stride_r + cols).to(tl.float32)
        tl.store(Y + row * stride_y + cols, acc.to(Y.dtype.element_ty))

    _skinny = Launcher(_skinny_kernel)
    _split_reduce = Launcher(_split_reduce_kernel)


def swiglu_config(cfg: SkinnyConfig | None, n: int, k: int) -> SkinnyConfig | None:
    """The launch shape of `skinny_linear(..., swiglu=True)` for a [gate; up] weight [n, k] whose
    plain GEMM has launch shape cfg: cfg's tile for the gate rows and as many up rows, so half
    the programs, each reading twice the weight (and each sum in the plain GEMM's order: the same
    bits). None where cfg splits K (the activation needs whole sums) or its tile does not divide
    the n / 2 gate rows. Measured on an H200 (full decode graph, GPU time): B = 1 / 16 went
    2.95 / 3.26 -> 2.92 / 3.22 ms; with half-height tiles (the plain GEMM's grid) it did not move
    (benchmarks/results/step_graph_*_h200.json)."""
    if cfg is None or cfg.split_k != 1 or not cfg.fits(n // 2, k):
        return None
    return cfg


def skinny_linear(x: Tensor, weight: Tensor, residual: Tensor | None, cfg: SkinnyConfig,
                  swiglu: bool = False, out: Tensor | None = None) -> Tensor:
    """x [M, K] @ weight [N, K]ᵀ (+ residual [M, N]) -> [M, N] in x's dtype, with launch shape cfg.
    With swiglu, weight is [gate; up] and the result silu(x @ gateᵀ) * (x @ upᵀ) [M, N / 2]
    (no residual; cfg from swiglu_config). x's rows must be contiguous and weight contiguous;
    cfg must fit (N, K), or (N / 2, K) with swiglu. `out`: where to write the result (rows with
    unit column stride, not aliasing x; residual itself is allowed: each program reads its residual
    tile before it writes that tile), else a new tensor."""
    m, k = x.shape
    n = weight.shape[0] // 2 if swiglu else weight.shape[0]
    if out is None:
        y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    elif out.shape != (m, n) or out.dtype != x.dtype or out.stride(1) != 1:
        raise ValueError(f"out must be [{m}, {n}] {x.dtype} with unit column stride, got "
                         f"{tuple(out.shape)} {out.dtype} strides {out.stride()}")
    else:
        y = out
    block_m = row_block(m)
    has_residual = residual is not None
    r = residual if has_residual else y
    ws = y
    if cfg.split_k > 1:
        ws = torch.empty(cfg.split_k, block_m, n, dtype=torch.float32, device=x.device)
    launch = pdl.launch_args(x.device)
    _skinny((n // cfg.block_n, cfg.split_k), x, weight, y, r, ws, m, x.stride(0), y.stride(0), r.stride(0),
            N=n, K=k, SPLIT_K=cfg.split_k, HAS_RESIDUAL=has_residual, SWIGLU=swiglu,
            BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **launch)
    if cfg.split_k > 1:
        block = 512 if n % 512 == 0 else cfg.block_n
        _split_reduce((m, n // block), ws, y, r, m, y.stride(0), r.stride(0), N=n, SPLIT_K=cfg.split_k,
                      HAS_RESIDUAL=has_residual, BLOCK_M=block_m, BLOCK=block, num_warps=4, **launch)
    return y

