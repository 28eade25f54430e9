"""Fused CUDA kernels (Triton) for the talker's elementwise work, with the plain-torch math as
the reference they must reproduce.

A decode step at batch 1 is launch-bound: the plain layer issues ~45 small kernels (RMSNorm
alone is 7: cast, square, mean, rsqrt, multiply, cast, scale). Each fused kernel here does one
pass over its rows and rounds exactly where the torch math rounds (normalise in fp32, cast to
the activation dtype, then scale; RoPE products rounded before their sum), so the fused and
plain paths agree to the last bit on the same hardware in most elements and to one bf16 ulp
elsewhere (transcendentals may differ by an ulp in fp32).

The GEMMs go through the same object: on CUDA, a GEMM of at most 16 bfloat16/float16 rows (decode
steps of small batches) runs the skinny kernel of skinny_gemm.py, as do those of up to 64 rows for
the weight shapes it has measured launch shapes for; the rest cuBLAS. Inside `gemm_row_blocks`
(the runner's eager steps) GEMMs of a few more rows run as blocks of at most 64 on the skinny
kernel. `CublasOps` keeps cuBLAS for all of them, as the baseline benchmarks compare against.

On Hopper every kernel here (and the skinny GEMM's) launches with programmatic dependent launch
(pdl.py): it waits for its predecessor in-kernel, so the GPU places it while that one drains.

`Ops` picks the implementation once, at construction: `TorchOps` (CPU, reference, tests) or
`TritonOps` (CUDA). The model calls `ops.rms_norm(...)` and never asks which one it has.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor

from higgs_serve.kernels import pdl
from higgs_serve.kernels.launcher import Launcher, cdiv, next_pow2
from higgs_serve.model.skinny_gemm import MAX_ROWS, SkinnyConfig, config_for, skinny_linear, swiglu_config

try:
    import triton
    import triton.language as tl

    from higgs_serve.kernels.pdl import pdl_release, pdl_wait
except ImportError:  # CPU-only installs
    triton = None


class _RowBlocks(threading.local):
    limit = MAX_ROWS  # GEMMs of up to this many rows may run as blocks of MAX_ROWS (this thread)


_row_blocks = _RowBlocks()


@contextmanager
def gemm_row_blocks(limit: int) -> Iterator[None]:
    """While open (on this thread), a GEMM of MAX_ROWS to `limit` rows runs as blocks of at most
    MAX_ROWS rows on the skinny kernel instead of one cuBLAS call. Each block reads the weight
    again (two passes at 65-128 rows), but every launch can go on a launch tape, where a cuBLAS
    call cannot: the runner opens it around its eager steps, which are bound by host time, not
    by the weight read (docs/architecture.md#launch-tapes). Graph captures stay on cuBLAS."""
    before = _row_blocks.limit
    _row_blocks.limit = max(limit, MAX_ROWS)
    try:
        yield
    finally:
        _row_blocks.limit = before


class TorchOps:
    """Reference math (transformers Qwen3 numerics)."""

    name = "torch"
    skinny_gemm = False  # TritonOps routes decode GEMMs to skinny_gemm.py

    @staticmethod
    def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return weight * xf.to(dtype)

    @classmethod
    def qk_norm_rope(cls, qkv: Tensor, q_weight: Tensor, k_weight: Tensor, eps: float, cos: Tensor, sin: Tensor,
                     num_heads: int, num_kv_heads: int, head_dim: int) -> tuple[Tensor, Tensor, Tensor]:
        """qkv [N, (Hq + 2 Hkv) Dh], cos/sin [N, 1, Dh] -> q [N, Hq, Dh], k [N, Hkv, Dh] (normed,
        rotated), v [N, Hkv, Dh]."""
        n = qkv.shape[0]
        q, k, v = qkv.split((num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim), dim=-1)
        q = _rotate(cls.rms_norm(q.view(n, num_heads, head_dim), q_weight, eps), cos, sin)
        k = _rotate(cls.rms_norm(k.view(n, num_kv_heads, head_dim), k_weight, eps), cos, sin)
        return q, k, v.view(n, num_kv_heads, head_dim)

    @staticmethod
    def silu_mul(gate_up: Tensor) -> Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    @staticmethod
    def linear(x: Tensor, weight: Tensor) -> Tensor:
        """x @ weightᵀ."""
        return F.linear(x, weight)

    @staticmethod
    def linear_residual(x: Tensor, weight: Tensor, residual: Tensor, out: Tensor | None = None) -> Tensor:
        """residual + x @ weightᵀ, into `out` when given (not aliasing x; residual itself is allowed:
        in place)."""
        return torch.add(residual, F.linear(x, weight), out=out)

    @classmethod
    def linear_silu_mul(cls, x: Tensor, gate_up: Tensor) -> Tensor:
        """silu_mul(x @ gate_upᵀ): the MLP's first half, gate_up [2I, D] -> [N, I]."""
        return cls.silu_mul(cls.linear(x, gate_up))


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


if triton is not None:

    @triton.jit
    def _rms_norm_kernel(X, W, Y, stride_x, stride_y, eps, D: tl.constexpr, BLOCK: tl.constexpr,
                         USE_PDL: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        mask = offs < D
        w = tl.load(W + offs, mask=mask, other=0.0)
        pdl_wait(USE_PDL)
        x = tl.load(X + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
        inv = tl.rsqrt(tl.sum(x * x, 0) / D + eps)
        normed = (x * inv).to(w.dtype)  # round to the activation dtype, then scale (as torch does)
        pdl_release(USE_PDL)
        tl.store(Y + row * stride_y + offs, (normed.to(tl.float32) * w.to(tl.float32)).to(w.dtype), mask=mask)

    @triton.jit
    def _qk_norm_rope_kernel(QKV, QW, KW, COS, SIN, Q, K, eps, stride_qkv, stride_cs, stride_q, stride_k,
                             NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                             USE_PDL: tl.constexpr):
        token = tl.program_id(0)
        head = tl.program_id(1)  # 0..Hq-1 are query heads, then Hkv key heads
        half: tl.constexpr = HEAD_DIM // 2
        offs = tl.arange(0, half)
        is_q = head < NUM_HEADS
        w_ptr = tl.where(is_q, QW, KW)
        w_lo = tl.load(w_ptr + offs)
        w_hi = tl.load(w_ptr + half + offs)
        pdl_wait(USE_PDL)
        src = QKV + token * stride_qkv + head * HEAD_DIM
        lo = tl.load(src + offs).to(tl.float32)
        hi = tl.load(src + half + offs).to(tl.float32)
        dtype = w_lo.dtype
        inv = tl.rsqrt((tl.sum(lo * lo, 0) + tl.sum(hi * hi, 0)) / HEAD_DIM + eps)
        n_lo = ((lo * inv).to(dtype).to(tl.float32) * w_lo.to(tl.float32)).to(dtype).to(tl.float32)
        n_hi = ((hi * inv).to(dtype).to(tl.float32) * w_hi.to(tl.float32)).to(dtype).to(tl.float32)
        # cos/sin come rounded from the shared table (both halves hold the same angles)
        cos = tl.load(COS + token * stride_cs + offs).to(tl.float32)
        sin = tl.load(SIN + token * stride_cs + offs).to(tl.float32)
        # x*cos + rotate(x)*sin, each product rounded before the sum (torch rounds per op)
        out_lo = ((n_lo * cos).to(dtype).to(tl.float32) + (-n_hi * sin).to(dtype).to(tl.float32)).to(dtype)
        out_hi = ((n_hi * cos).to(dtype).to(tl.float32) + (n_lo * sin).to(dtype).to(tl.float32)).to(dtype)
        pdl_release(USE_PDL)
        if is_q:
            dst = Q + token * stride_q + head * HEAD_DIM
        else:
            dst = K + token * stride_k + (head - NUM_HEADS) * HEAD_DIM
        tl.store(dst + offs, out_lo)
        tl.store(dst + half + offs, out_hi)

    @triton.jit
    def _silu_mul_kernel(GU, OUT, stride_gu, stride_out, I: tl.constexpr, BLOCK: tl.constexpr,
                         USE_PDL: tl.constexpr):
        pdl_wait(USE_PDL)
        row = tl.program_id(0)
        col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = col < I
        gate = tl.load(GU + row * stride_gu + col, mask=mask, other=0.0)
        up = tl.load(GU + row * stride_gu + I + col, mask=mask, other=0.0)
        dtype = gate.dtype
        g = gate.to(tl.float32)
        act = (g / (1.0 + tl.exp(-g))).to(dtype)  # F.silu rounds its output
        pdl_release(USE_PDL)
        tl.store(OUT + row * stride_out + col, (act.to(tl.float32) * up.to(tl.float32)).to(dtype), mask=mask)

    _rms_norm = Launcher(_rms_norm_kernel)
    _qk_norm_rope = Launcher(_qk_norm_rope_kernel)
    _silu_mul = Launcher(_silu_mul_kernel)


class TritonOps(TorchOps):
    """CUDA kernels; same signatures and rounding points as TorchOps."""

    name = "triton"
    skinny_gemm = True

    @staticmethod
    def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
        # Eager steps call this ~70 times a step: the 2-D case skips the reshape and view (each a
        # few microseconds of host time, as much as the kernel's GPU time).
        d = x.shape[-1]
        rows = x if x.dim() == 2 else x.reshape(-1, d)
        out = torch.empty_like(rows)
        n = rows.shape[0]
        if n:
            _rms_norm((n,), rows, weight, out, rows.stride(0), out.stride(0), eps, D=d, BLOCK=next_pow2(d),
                      num_warps=4, **pdl.launch_args(x.device))
        return out if rows is x else out.view(x.shape)

    @staticmethod
    def qk_norm_rope(qkv: Tensor, q_weight: Tensor, k_weight: Tensor, eps: float, cos: Tensor, sin: Tensor,
                     num_heads: int, num_kv_heads: int, head_dim: int) -> tuple[Tensor, Tensor, Tensor]:
        n = qkv.shape[0]
        # cos/sin [N, 1, Dh] or [N, Dh] with unit last stride: only the row stride is passed
        q = torch.empty(n, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
        k = torch.empty(n, num_kv_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
        if n:
            _qk_norm_rope((n, num_heads + num_kv_heads),
                qkv, q_weight, k_weight, cos, sin, q, k, eps, qkv.stride(0), cos.stride(0), q.stride(0), k.stride(0),
                NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, num_warps=1,
                **pdl.launch_args(qkv.device))
        v = qkv[:, (num_heads + num_kv_heads) * head_dim:].view(n, num_kv_heads, head_dim)
        return q, k, v

    @staticmethod
    def silu_mul(gate_up: Tensor) -> Tensor:
        n, two_i = gate_up.shape
        i = two_i // 2
        out = torch.empty(n, i, dtype=gate_up.dtype, device=gate_up.device)
        if n:
            block = 1024
            _silu_mul((n, cdiv(i, block)), gate_up, out, gate_up.stride(0), out.stride(0),
                      I=i, BLOCK=block, num_warps=4, **pdl.launch_args(gate_up.device))
        return out

    @classmethod
    def linear(cls, x: Tensor, weight: Tensor) -> Tensor:
        blocks = cls._skinny(x, weight)
        return F.linear(x, weight) if blocks is None else _skinny_blocks(x, weight, None, blocks)

    @classmethod
    def linear_residual(cls, x: Tensor, weight: Tensor, residual: Tensor, out: Tensor | None = None) -> Tensor:
        blocks = cls._skinny(x, weight)
        if blocks is None:  # one GEMM with the residual as its beta=1 input: one rounding instead of two
            return torch.addmm(residual, x, weight.t(), out=out)
        return _skinny_blocks(x, weight, residual, blocks, out=out)

    @classmethod
    def linear_silu_mul(cls, x: Tensor, gate_up: Tensor) -> Tensor:
        # Decode rows: the skinny GEMM applies SiLU-and-multiply in its epilogue (one kernel and
        # one [N, 2I] round trip less a layer), rounding where the two kernels round.
        blocks = cls._skinny(x, gate_up, swiglu=True)
        if blocks is None:
            return super().linear_silu_mul(x, gate_up)
        return _skinny_blocks(x, gate_up, None, blocks, swiglu=True)

    @classmethod
    def _skinny(cls, x: Tensor, weight: Tensor, swiglu: bool = False) -> list[tuple[int, int, SkinnyConfig]] | None:
        """The skinny kernel's row blocks (start, end, launch shape) for this GEMM: one block, or
        blocks of MAX_ROWS inside `gemm_row_blocks`; None for cuBLAS: rows or shapes config_for
        does not serve (for any block), float32 (tl.dot would round to TF32 where cuBLAS does
        not), layouts it does not take."""
        if not cls.skinny_gemm or x.dtype not in (torch.bfloat16, torch.float16) or x.dim() != 2 \
                or x.stride(1) != 1 or not weight.is_contiguous():
            return None
        m, (n, k) = x.shape[0], weight.shape
        if m > _row_blocks.limit:
            return None
        blocks = []
        for start in range(0, m, MAX_ROWS) if m else (0,):
            end = min(start + MAX_ROWS, m)
            cfg = config_for(end - start, n, k, _num_sms(x.device))
            cfg = swiglu_config(cfg, n, k) if swiglu else cfg
            if cfg is None:
                return None
            blocks.append((start, end, cfg))
        return blocks


class CublasOps(TritonOps):
    """TritonOps with every GEMM on cuBLAS: the baseline the skinny kernel is measured against."""

    name = "triton-cublas"
    skinny_gemm = False


def _skinny_blocks(x: Tensor, weight: Tensor, residual: Tensor | None, blocks: list[tuple[int, int, SkinnyConfig]],
                   swiglu: bool = False, out: Tensor | None = None) -> Tensor:
    """skinny_linear over `blocks` of x's rows, into one output (`TritonOps._skinny`)."""
    if len(blocks) == 1:
        return skinny_linear(x, weight, residual, blocks[0][2], swiglu=swiglu, out=out)
    n = weight.shape[0] // 2 if swiglu else weight.shape[0]
    y = torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device) if out is None else out
    for start, end, cfg in blocks:
        skinny_linear(x[start:end], weight, None if residual is None else residual[start:end], cfg, swiglu=swiglu,
                      out=y[start:end])
    return y


def warm_up_gemms(ops: type[TorchOps], run_gemms: Callable[[int], None]) -> None:
    """Call run_gemms(rows) for every row count the skinny kernel serves: Triton compiles a
    variant per launch shape on first use, which must happen at start-up, not on live traffic.
    A no-op for ops without the kernel."""
    if ops.skinny_gemm:
        for rows in range(1, MAX_ROWS + 1):
            run_gemms(rows)


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def ops_for(device: torch.device | str) -> type[TorchOps]:
    """TritonOps on CUDA when Triton is importable, TorchOps otherwise."""
    if torch.device(device).type == "cuda" and triton is not None:
        return TritonOps
    return TorchOps
