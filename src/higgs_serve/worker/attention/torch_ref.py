"""Reference paged attention in plain PyTorch: the oracle for the Triton kernels, and the CPU path.
An fp8 cache (`kv_cache_dtype`) is written with `to_cache` and read back with `from_cache`.

Clear over fast: per request, gather the context from its pages into contiguous [T, Hkv, Dh]
tensors and call SDPA with an explicit causal-offset mask. Host loops and syncs are fine here;
this backend is never captured in a CUDA graph.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from higgs_serve.worker.attention.backend import AttentionBackend, BoundAttention, KVCache, softmax_scale
from higgs_serve.worker.attention.kv_cache_dtype import byte_view, from_cache, to_cache
from higgs_serve.worker.attention.metadata import AttentionMetadata


def write_kv(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """Scatter new k/v [N, Hkv, Dh] into the caches at `slot_mapping` [N]; slots < 0 are skipped.
    An fp8 cache gets them clamped and cast (`to_cache`)."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    for new, cache in ((k, k_cache), (v, v_cache)):
        rows = byte_view(to_cache(new[keep], cache.dtype))
        # [num_blocks, block_size, Hkv, Dh] -> [num_slots, Hkv, Dh]: slot = block * block_size + offset
        byte_view(cache).view(-1, *cache.shape[2:]).index_copy_(0, slots, rows)


def gather_context(cache: Tensor, block_table: Tensor, length: int) -> Tensor:
    """The first `length` tokens of one request: cache [num_blocks, bs, Hkv, Dh] -> [length, Hkv, Dh]
    in the cache's dtype."""
    block_size = cache.shape[1]
    num_pages = -(-length // block_size)
    pages = byte_view(cache)[block_table[:num_pages].long()].view(cache.dtype)  # [num_pages, bs, Hkv, Dh]
    return pages.reshape(-1, *cache.shape[2:])[:length]


def causal_attention(q: Tensor, k: Tensor, v: Tensor, start_pos: int) -> Tensor:
    """q [S, Hq, Dh] at positions start_pos.. over k/v [T, Hkv, Dh]; query i sees keys [0, start_pos + i]."""
    num_q, num_heads, head_dim = q.shape
    groups = num_heads // k.shape[1]
    q_pos = torch.arange(start_pos, start_pos + num_q, device=q.device)
    k_pos = torch.arange(k.shape[0], device=q.device)
    mask = k_pos[None, :] <= q_pos[:, None]  # [S, T], True = may attend
    # fp32 math: the softmax must be fp32 and this is the oracle, so do all of it in fp32.
    qh = q.float().transpose(0, 1)  # [Hq, S, Dh]
    kh = k.float().repeat_interleave(groups, dim=1).transpose(0, 1)  # [Hq, T, Dh]
    vh = v.float().repeat_interleave(groups, dim=1).transpose(0, 1)
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=softmax_scale(head_dim))
    return out.transpose(0, 1).to(q.dtype)  # [S, Hq, Dh]


def paged_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata) -> Tensor:
    """Attention of every request's query rows over its paged context (already written)."""
    out = torch.zeros_like(q)
    starts = meta.query_start_loc.tolist()
    seq_lens = meta.seq_lens.tolist()
    for b, seq_len in enumerate(seq_lens):
        q_lo, q_hi = starts[b], starts[b + 1]
        if q_hi == q_lo or seq_len == 0:
            continue  # no query rows, or a padded request: its rows stay 0
        if seq_len < q_hi - q_lo:
            raise ValueError(f"seq_lens[{b}] = {seq_len} is shorter than its {q_hi - q_lo} query tokens")
        # dequantized to q's dtype: exact for fp8, and what the Triton kernels compute with
        keys = from_cache(gather_context(k_cache, meta.block_tables[b], seq_len), q.dtype)
        values = from_cache(gather_context(v_cache, meta.block_tables[b], seq_len), q.dtype)
        out[q_lo:q_hi] = causal_attention(q[q_lo:q_hi], keys, values, seq_len - (q_hi - q_lo))
    return out


class TorchBoundAttention(BoundAttention):
    """One step's `Attention` callable over the reference implementation."""

    def write(self, layer_idx: int, k: Tensor, v: Tensor) -> None:
        k_cache, v_cache = self.kv_caches[layer_idx]
        write_kv(k, v, k_cache, v_cache, self.meta.slot_mapping)

    def attend(self, layer_idx: int, q: Tensor, out: Tensor | None = None) -> Tensor:
        k_cache, v_cache = self.kv_caches[layer_idx]
        result = paged_attention(q, k_cache, v_cache, self.meta)
        if out is None:
            return result
        out.copy_(result)
        return out


class TorchPagedAttention(AttentionBackend):
    name = "torch"

    def bind(self, meta: AttentionMetadata, kv_caches: list[KVCache]) -> TorchBoundAttention:
        return TorchBoundAttention(meta, kv_caches)
