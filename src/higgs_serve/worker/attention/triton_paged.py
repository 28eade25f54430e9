"""Paged attention on CUDA with Triton kernels (no flash-attn / flashinfer).
(Just over 400 lines on purpose: each kernel sits beside its launch wrapper, whose grid and
constexprs must match it; apart they would be read and changed out of step.)

Three kernels, one concept each:
- `_kv_write_kernel`: scatter this step's k/v rows into the page pool at `slot_mapping`
  (negative slot = padding, skipped).
- `_decode_kernel` + `_decode_reduce_kernel`: one query token per request (flash-decoding).
  A program owns (request, KV head, split): it loads the GROUP = Hq/Hkv query heads that share
  the KV head, so every K/V page is read once per step, and walks one contiguous slice of the
  context. At batch 1 there are only Hkv = 8 (request, KV head) pairs, far fewer than the
  H200's 132 SMs, so the context is split NUM_SPLITS ways and a second kernel merges the
  partial softmaxes by their log-sum-exp. The split count is a runtime argument the kernels
  never specialize on (a new batch size must not compile a kernel on live traffic; the merge
  kernel's power-of-two padding is compiled for every value at start-up by `warm_up_kernels`).
  It depends only on the batch size (never on
  the context length): each program reads its slice bounds from `seq_lens` on the device, so
  the launch is CUDA-graph capturable and one capture serves every context length.
- `_prefill_kernel`: any mix of prefill chunks and decodes. A program owns (query block,
  request, query head) and streams the request's context up to the block's last position with
  an online softmax and a causal mask at the query's absolute position.

Tokens are gathered per key row (page = block_table[t // block_size], offset t % block_size),
so any block size works; head_dim must be a power of two ≥ 16 (tensor-core dot shapes).
Softmax math is fp32 (base-2 exponentials with log2(e) folded into the scale).

An fp8 cache (`kv_cache_dtype: fp8`, scale 1.0, see kv_cache_dtype.py) changes two places only:
the write kernel clamps to ±448 and casts to e4m3 at the store, and the attention kernels cast
each K/V tile to float16 right after the load and, under a 16-bit model, run their two dots in
float16 (q cast once, the probabilities per tile; a float32 model upcasts the tiles to float32
and keeps its exact dots), the softmax in fp32 unchanged. float16, not bfloat16: it holds
every e4m3 value exactly and Hopper converts e4m3 to it in one instruction, where the bf16
conversion detours through fp32 per element and made the decode step slower than a bf16 cache
(H200, B = 64, L = 4096: 16.1 against 13.8 ms). q is O(1) after its RMSNorm, far inside fp16's
range. The merge kernel never touches the cache.

Every kernel here waits (`pdl_wait`) before its first read of step data, releases its successor
(`pdl_release`) before its final stores, and launches with programmatic dependent launch where
the device has it (kernels/pdl.py): a decode step's kernels are placed while the one before
them drains.
"""

from __future__ import annotations

import torch
from torch import Tensor

from higgs_serve.worker.attention.backend import softmax_scale
from higgs_serve.worker.attention.kv_cache_dtype import FP8_E4M3_MAX, is_fp8
from higgs_serve.worker.attention.metadata import AttentionMetadata

try:
    import triton
    import triton.language as tl

    from higgs_serve.kernels.pdl import pdl_release, pdl_wait
except ImportError:  # CPU-only installs: the backend refuses to start, the module still imports
    triton = None

from higgs_serve.kernels import pdl
from higgs_serve.kernels.launcher import Launcher, cdiv, next_pow2

LOG2E = 1.4426950408889634
MAX_DECODE_SPLITS = 32
DECODE_BLOCK_N = 64
DECODE_NUM_WARPS = 4
PREFILL_MIN_BLOCK_M = 32  # the prefill kernel's query tile: 32 rows in float32, 64 in 16-bit dtypes
DECODE_NUM_STAGES = 3  # Triton's default for Hopper; benchmarks/step/bench_attention.py --sweep varies these


if triton is not None:
    _FP8_MAX = tl.constexpr(FP8_E4M3_MAX)  # a jit function may only read constexpr globals

    @triton.jit
    def _load_kv_tile(cache, page, row, kv_head, offs_d, n_mask, stride_b, stride_s, stride_h):
        """Rows (page[i], row[i]) of one KV head: [BLOCK_N, HEAD_DIM] in the cache's dtype, 0 where
        n_mask is off."""
        ptrs = cache + page[:, None] * stride_b + row[:, None] * stride_s + kv_head * stride_h + offs_d[None, :]
        return tl.load(ptrs, mask=n_mask[:, None], other=0.0)

    @triton.jit
    def _kv_write_kernel(
        K, V, K_cache, V_cache, slot_mapping,
        stride_kn, stride_kh, stride_vn, stride_vh,
        stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
        BLOCK_SIZE: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr,
        HEAD_DIM: tl.constexpr, KV_FP8: tl.constexpr, USE_PDL: tl.constexpr,
    ):
        pdl_wait(USE_PDL)
        token = tl.program_id(0)
        slot = tl.load(slot_mapping + token)  # int64
        if slot < 0:
            return
        block = slot // BLOCK_SIZE
        offset = slot % BLOCK_SIZE
        offs_h = tl.arange(0, HEADS_PAD)
        offs_d = tl.arange(0, HEAD_DIM)
        mask = (offs_h < NUM_KV_HEADS)[:, None]
        k = tl.load(K + token * stride_kn + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask)
        v = tl.load(V + token * stride_vn + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
        if KV_FP8:  # saturate first: e4m3 has no infinity, an out-of-range cast would give NaN
            k = tl.minimum(tl.maximum(k.to(tl.float32), -_FP8_MAX), _FP8_MAX)
            v = tl.minimum(tl.maximum(v.to(tl.float32), -_FP8_MAX), _FP8_MAX)
        pdl_release(USE_PDL)
        k_dst = K_cache + block * stride_kcb + offset * stride_kcs + offs_h[:, None] * stride_kch + offs_d[None, :]
        v_dst = V_cache + block * stride_vcb + offset * stride_vcs + offs_h[:, None] * stride_vch + offs_d[None, :]
        tl.store(k_dst, k.to(K_cache.dtype.element_ty), mask=mask)
        tl.store(v_dst, v.to(V_cache.dtype.element_ty), mask=mask)

    @triton.jit(do_not_specialize=["num_splits"])
    def _decode_kernel(
        Q, K_cache, V_cache, O_part, LSE_part, block_tables, seq_lens, qk_scale,
        stride_qn, stride_qh,
        stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
        stride_bt,
        stride_ob, stride_os, stride_oh,
        stride_lb, stride_ls, num_splits,
        BLOCK_SIZE: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
        HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
        DOT_PRECISION: tl.constexpr, FP16_DOTS: tl.constexpr, USE_PDL: tl.constexpr,
    ):
        pdl_wait(USE_PDL)
        req = tl.program_id(0)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        ctx_len = tl.load(seq_lens + req)
        # This split's slice [n_start, n_end) of the context, in whole BLOCK_N tiles.
        tiles_per_split = tl.cdiv(tl.cdiv(ctx_len, BLOCK_N), num_splits)
        n_start = split * tiles_per_split * BLOCK_N
        n_end = tl.minimum(ctx_len, n_start + tiles_per_split * BLOCK_N)

        offs_g = tl.arange(0, GROUP_PAD)
        offs_d = tl.arange(0, HEAD_DIM)
        g_mask = offs_g < GROUP
        heads = kv_head * GROUP + offs_g  # the query heads of this KV head
        q = tl.load(Q + req * stride_qn + heads[:, None] * stride_qh + offs_d[None, :], mask=g_mask[:, None], other=0.0)
        if FP16_DOTS:
            q = q.to(tl.float16)  # see the module note: fp8 tiles upcast to fp16 in one instruction

        m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
        acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)
        table = block_tables + req * stride_bt
        for n0 in range(n_start, n_end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            n_mask = offs_n < n_end
            page = tl.load(table + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
            row = offs_n % BLOCK_SIZE
            # fp8 caches: upcast to q's dtype at the load (exact; a no-op for a model-dtype cache)
            k = _load_kv_tile(K_cache, page, row, kv_head, offs_d, n_mask, stride_kcb, stride_kcs, stride_kch).to(q.dtype)
            v = _load_kv_tile(V_cache, page, row, kv_head, offs_d, n_mask, stride_vcb, stride_vcs, stride_vch).to(q.dtype)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [GROUP_PAD, BLOCK_N], log2 units
            s = tl.where(n_mask[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every tile holds ≥ 1 valid key
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m_i = m_new

        pdl_release(USE_PDL)
        # An empty slice (short context, many splits) leaves l_i = 0: write o = 0, lse = -inf.
        has_keys = l_i > 0.0
        out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
        lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
        o_ptrs = O_part + req * stride_ob + split * stride_os + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, out.to(O_part.dtype.element_ty), mask=g_mask[:, None])
        tl.store(LSE_part + req * stride_lb + split * stride_ls + heads, lse, mask=g_mask)

    @triton.jit(do_not_specialize=["num_splits"])
    def _decode_reduce_kernel(
        O_part, LSE_part, O,
        stride_pb, stride_ps, stride_ph,
        stride_lb, stride_ls,
        stride_on, stride_oh,
        num_splits, SPLITS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, USE_PDL: tl.constexpr,
    ):
        pdl_wait(USE_PDL)
        req = tl.program_id(0)
        head = tl.program_id(1)
        offs_s = tl.arange(0, SPLITS_PAD)
        offs_d = tl.arange(0, HEAD_DIM)
        s_mask = offs_s < num_splits
        lse = tl.load(LSE_part + req * stride_lb + offs_s * stride_ls + head, mask=s_mask, other=float("-inf"))
        m = tl.max(lse, 0)
        m = tl.where(m == float("-inf"), 0.0, m)  # no keys at all (padded request): weights 0
        w = tl.exp2(lse - m)  # [SPLITS_PAD], 0 for empty splits
        live = s_mask & (lse > float("-inf"))
        parts = tl.load(
            O_part + req * stride_pb + offs_s[:, None] * stride_ps + head * stride_ph + offs_d[None, :],
            mask=live[:, None], other=0.0,
        )
        denom = tl.sum(w, 0)
        pdl_release(USE_PDL)
        out = tl.sum(parts * w[:, None], 0) / tl.where(denom > 0.0, denom, 1.0)
        tl.store(O + req * stride_on + head * stride_oh + offs_d, out.to(O.dtype.element_ty))

    @triton.jit(do_not_specialize=["first_request"])
    def _prefill_kernel(
        Q, K_cache, V_cache, O, block_tables, query_start_loc, seq_lens, qk_scale,
        stride_qn, stride_qh, stride_on, stride_oh,
        stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
        stride_bt, first_request,
        BLOCK_SIZE: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr, FP16_DOTS: tl.constexpr,
        USE_PDL: tl.constexpr,
    ):
        pdl_wait(USE_PDL)
        m_block = tl.program_id(0)
        req = first_request + tl.program_id(1)
        head = tl.program_id(2)
        q_start = tl.load(query_start_loc + req)
        q_len = tl.load(query_start_loc + req + 1) - q_start
        if m_block * BLOCK_M >= q_len:
            return
        ctx_len = tl.load(seq_lens + req)
        start_pos = ctx_len - q_len  # absolute position of this request's first query token
        kv_head = head // GROUP

        offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, HEAD_DIM)
        m_mask = offs_m < q_len
        q = tl.load(
            Q + (q_start + offs_m)[:, None] * stride_qn + head * stride_qh + offs_d[None, :],
            mask=m_mask[:, None], other=0.0,
        )
        if FP16_DOTS:
            q = q.to(tl.float16)  # see the module note: fp8 tiles upcast to fp16 in one instruction
        q_pos = start_pos + offs_m  # [BLOCK_M]

        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
        # The block's last row (valid or not) sits at start_pos + (m_block+1)*BLOCK_M − 1.
        kv_end = tl.minimum(ctx_len, start_pos + (m_block + 1) * BLOCK_M)
        table = block_tables + req * stride_bt
        for n0 in range(0, kv_end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            n_mask = offs_n < kv_end
            page = tl.load(table + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
            row = offs_n % BLOCK_SIZE
            # fp8 caches: upcast to q's dtype at the load (exact; a no-op for a model-dtype cache)
            k = _load_kv_tile(K_cache, page, row, kv_head, offs_d, n_mask, stride_kcb, stride_kcs, stride_kch).to(q.dtype)
            v = _load_kv_tile(V_cache, page, row, kv_head, offs_d, n_mask, stride_vcb, stride_vcs, stride_vch).to(q.dtype)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
            visible = n_mask[None, :] & (offs_n[None, :] <= q_pos[:, None])
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            # Key 0 is visible to every row, so m_new is finite from the first tile on; the
            # guard only keeps a hypothetical all-masked row from producing NaN.
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m_i = m_new

        pdl_release(USE_PDL)
        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        o_ptrs = O + (q_start + offs_m)[:, None] * stride_on + head * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=m_mask[:, None])

    _kv_write = Launcher(_kv_write_kernel)
    _decode = Launcher(_decode_kernel)
    _decode_reduce = Launcher(_decode_reduce_kernel)
    _prefill = Launcher(_prefill_kernel)


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 inputs would silently use TF32 tensor cores (~1e-3 error); fp32 is the exact mode.
    return "ieee" if dtype == torch.float32 else "tf32"


def _fp16_dots(q_dtype: torch.dtype, cache_dtype: torch.dtype) -> bool:
    """fp8 cache under a 16-bit model: dots in fp16 (module note). A float32 model keeps its
    exact float32 dots, the fp8 tiles upcast to float32."""
    return is_fp8(cache_dtype) and q_dtype != torch.float32


def decode_num_splits(num_requests: int, num_kv_heads: int, num_sms: int) -> int:
    """Splits per (request, KV head) so that about two programs per SM exist; batch-size only."""
    programs = num_requests * num_kv_heads
    return max(1, min(MAX_DECODE_SPLITS, -(-2 * num_sms // programs)))


def write_kv_triton(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    _kv_write((num_tokens,),
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        BLOCK_SIZE=k_cache.shape[1], NUM_KV_HEADS=num_kv_heads, HEADS_PAD=next_pow2(num_kv_heads),
        HEAD_DIM=head_dim, KV_FP8=is_fp8(k_cache.dtype), **pdl.launch_args(k.device),
    )


class DecodeWorkspace:
    """Split-K scratch, allocated once per bound step (shared by all layers, which run in order)."""

    def __init__(self, num_requests: int, num_heads: int, head_dim: int, num_splits: int, device: torch.device):
        self.num_splits = num_splits
        # fp32 partial outputs: the merge re-weights them, keep the precision until then.
        self.partial = torch.empty(num_requests, num_splits, num_heads, head_dim, dtype=torch.float32, device=device)
        self.lse = torch.empty(num_requests, num_splits, num_heads, dtype=torch.float32, device=device)


def paged_decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata, work: DecodeWorkspace,
                 out: Tensor | None = None) -> Tensor:
    """q [B, Hq, Dh] (row b = request b) -> o [B, Hq, Dh] (into `out` when given)."""
    num_requests, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(q)
    splits = work.num_splits
    # One split: the kernel writes the final output itself ([B, 1, Hq, Dh] view of o).
    partial = work.partial if splits > 1 else out.unsqueeze(1)
    _decode((num_requests, num_kv_heads, splits),
        q, k_cache, v_cache, partial, work.lse, meta.block_tables, meta.seq_lens,
        softmax_scale(head_dim) * LOG2E,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        meta.block_tables.stride(0),
        partial.stride(0), partial.stride(1), partial.stride(2),
        work.lse.stride(0), work.lse.stride(1), splits,
        BLOCK_SIZE=k_cache.shape[1], GROUP=group, GROUP_PAD=max(16, next_pow2(group)),
        HEAD_DIM=head_dim, BLOCK_N=DECODE_BLOCK_N,
        DOT_PRECISION=_dot_precision(q.dtype), FP16_DOTS=_fp16_dots(q.dtype, k_cache.dtype),
        num_warps=DECODE_NUM_WARPS, num_stages=DECODE_NUM_STAGES, **pdl.launch_args(q.device),
    )
    if splits > 1:
        _decode_reduce((num_requests, num_heads),
            work.partial, work.lse, out,
            work.partial.stride(0), work.partial.stride(1), work.partial.stride(2),
            work.lse.stride(0), work.lse.stride(1),
            out.stride(0), out.stride(1), splits,
            SPLITS_PAD=next_pow2(splits), HEAD_DIM=head_dim,
            num_warps=4, **pdl.launch_args(q.device),
        )
    return out


def warm_up_kernels(k_cache: Tensor, v_cache: Tensor, num_heads: int, max_requests: int, scratch_block: int,
                    num_sms: int, block_table_width: int, q_dtype: torch.dtype) -> list[int]:
    """Compile the attention kernels for every batch size up to `max_requests` now: the prefill
    kernel once, the decode kernels once per distinct merge-kernel padding; each request one or
    two tokens of `scratch_block` (read only), block tables as wide as the caller's (Triton
    specializes on that stride), q in `q_dtype` (the compute dtype: an fp8 cache's q is not fp8).
    Returns the decode batch sizes run."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    by_pad: dict[int, int] = {}
    for b in range(1, max_requests + 1):
        by_pad.setdefault(next_pow2(decode_num_splits(b, num_kv_heads, num_sms)), b)
    device = k_cache.device
    for b in by_pad.values():
        meta = AttentionMetadata(
            query_start_loc=torch.arange(b + 1, dtype=torch.int32, device=device),
            seq_lens=torch.ones(b, dtype=torch.int32, device=device),
            block_tables=torch.full((b, block_table_width), scratch_block, dtype=torch.int32, device=device),
            slot_mapping=torch.full((b,), -1, dtype=torch.int64, device=device),
            max_query_len=1, max_seq_len=1,
        )
        q = torch.zeros(b, num_heads, head_dim, dtype=q_dtype, device=device)
        splits = decode_num_splits(b, num_kv_heads, num_sms)
        paged_decode(q, k_cache, v_cache, meta, DecodeWorkspace(b, num_heads, head_dim, splits, device))
        if b == 1:  # the same request as a two-token prompt chunk: the prefill kernel
            meta.query_start_loc[1] = 2
            meta.seq_lens[0] = 2
            meta.max_query_len = meta.max_seq_len = 2
            paged_prefill(torch.zeros(2, num_heads, head_dim, dtype=q_dtype, device=device),
                          k_cache, v_cache, meta)
    return sorted(by_pad.values())


def paged_prefill(q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata,
                  out: Tensor | None = None, first_request: int = 0) -> Tensor:
    """Any batch (prefill chunks and decodes): q [N, Hq, Dh] -> o [N, Hq, Dh] for requests
    first_request.. (an offset, not a sliced tensor: Triton specializes on pointer alignment, so
    slices would compile new variants on live traffic). Rows that belong to no request it runs
    keep what `out` held (zeros when it is not given)."""
    num_tokens, num_heads, head_dim = q.shape
    if out is None:
        out = torch.zeros_like(q)
    if num_tokens == 0 or meta.max_query_len == 0:
        return out
    block = 64 if q.element_size() <= 2 else PREFILL_MIN_BLOCK_M  # fp32 tiles are twice the registers
    grid = (cdiv(meta.max_query_len, block), meta.num_requests - first_request, num_heads)
    _prefill(grid,
        q, k_cache, v_cache, out, meta.block_tables, meta.query_start_loc, meta.seq_lens,
        softmax_scale(head_dim) * LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        meta.block_tables.stride(0), first_request,
        BLOCK_SIZE=k_cache.shape[1], GROUP=num_heads // k_cache.shape[2], HEAD_DIM=head_dim,
        BLOCK_M=block, BLOCK_N=block, DOT_PRECISION=_dot_precision(q.dtype),
        FP16_DOTS=_fp16_dots(q.dtype, k_cache.dtype),
        num_warps=4, **pdl.launch_args(q.device),
    )
    return out
