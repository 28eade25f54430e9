"""The Triton attention backend: binds one step's metadata and the KV caches to the kernels of
triton_paged.py. A pure-decode step runs the split decode kernel and its merge (graph-capturable:
the workspace is allocated once per bound step); a step with prompt chunks runs the decode kernel
on its leading one-token requests and the prefill kernel on the chunks after them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from higgs_serve.worker.attention.backend import AttentionBackend, BoundAttention, KVCache
from higgs_serve.worker.attention.metadata import AttentionMetadata
from higgs_serve.worker.attention.triton_paged import (PREFILL_MIN_BLOCK_M, DecodeWorkspace, decode_num_splits,
                                                        paged_decode, paged_prefill, triton, warm_up_kernels,
                                                        write_kv_triton)


def _check_triton_inputs(q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, meta: AttentionMetadata) -> None:
    head_dim = q.shape[2]
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"triton attention needs head_dim a power of two >= 16, got {head_dim}")
    for name, t in (("q", q), ("k", k), ("v", v), ("k_cache", k_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"triton attention needs {name} contiguous in head_dim, got strides {t.stride()}")
    if not k_cache.is_contiguous():
        raise ValueError("triton attention needs contiguous KV caches")
    if meta.block_tables.stride(-1) != 1:
        raise ValueError(f"block_tables must be contiguous in its last dim, got strides {meta.block_tables.stride()}")


class TritonBoundAttention(BoundAttention):
    """One step's `Attention` callable on the Triton kernels (decode path graph-capturable)."""

    def __init__(self, meta: AttentionMetadata, kv_caches: list[KVCache], num_sms: int) -> None:
        super().__init__(meta, kv_caches)
        self.num_sms = num_sms
        self._work: DecodeWorkspace | None = None
        self._decodes: AttentionMetadata | None = None  # a mixed step's leading decodes

    def _workspace(self, q: Tensor, num_kv_heads: int) -> DecodeWorkspace:
        num_requests, num_heads, head_dim = q.shape
        work = self._work
        if work is None or work.partial.shape[0] != num_requests or work.partial.shape[2:] != (num_heads, head_dim):
            splits = decode_num_splits(num_requests, num_kv_heads, self.num_sms)
            work = self._work = DecodeWorkspace(num_requests, num_heads, head_dim, splits, q.device)
        return work

    def check_inputs(self, q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor) -> None:
        _check_triton_inputs(q, k, v, k_cache, self.meta)

    def launch_key(self) -> tuple:
        """The kernels read lengths and pages on the device; on the host only the request counts
        and the prefill grid's query tiles vary (PREFILL_MIN_BLOCK_M rows is the smallest tile, so
        equal counts of it mean equal grids whatever the tile)."""
        meta = self.meta
        return meta.num_requests, meta.num_decodes, -(-meta.max_query_len // PREFILL_MIN_BLOCK_M)

    def write(self, layer_idx: int, k: Tensor, v: Tensor) -> None:
        """Scatter this step's k/v into layer `layer_idx`'s pages (graph-capturable)."""
        k_cache, v_cache = self.kv_caches[layer_idx]
        write_kv_triton(k, v, k_cache, v_cache, self.meta.slot_mapping)

    def attend(self, layer_idx: int, q: Tensor, out: Tensor | None = None) -> Tensor:
        """Attention over the pages already written (the piecewise path runs this eagerly)."""
        k_cache, v_cache = self.kv_caches[layer_idx]
        meta = self.meta
        if meta.is_pure_decode:
            return paged_decode(q, k_cache, v_cache, meta, self._workspace(q, k_cache.shape[2]), out)
        if out is None:
            # Without `out` the step runs eagerly: no zero fill (a launch and ~20 us of host time a
            # layer). The kernels write every row of a request; the rows of none (a taped eager
            # step's padding, worker/eager_tapes.py) keep whatever was there, and every later op
            # is row by row, so they reach no real row.
            out = torch.empty_like(q)
        d = meta.num_decodes
        if d == 0:
            return paged_prefill(q, k_cache, v_cache, meta, out)
        # A mixed step: the decode kernel for its leading one-token requests (the prefill kernel
        # would stream each one's whole context through a mostly empty query tile), the prefill
        # kernel for the chunks after them.
        if self._decodes is None:
            self._decodes = meta.leading(d)
        paged_decode(q[:d], k_cache, v_cache, self._decodes, self._workspace(q[:d], k_cache.shape[2]), out[:d])
        paged_prefill(q, k_cache, v_cache, meta, out, first_request=d)
        return out


class TritonPagedAttention(AttentionBackend):
    name = "triton"

    def __init__(self) -> None:
        if triton is None:
            raise RuntimeError("attention backend 'triton' needs the triton package (it ships with CUDA torch)")
        self._num_sms: dict[int, int] = {}

    def _sm_count(self, device: torch.device) -> int:
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in self._num_sms:
            self._num_sms[index] = torch.cuda.get_device_properties(index).multi_processor_count
        return self._num_sms[index]

    def warm_up(self, kv_caches: list[KVCache], num_heads: int, max_requests: int, scratch_block: int,
                block_table_width: int, q_dtype: torch.dtype) -> None:
        k_cache, v_cache = kv_caches[0]  # every layer's cache has the same shape and dtype
        warm_up_kernels(k_cache, v_cache, num_heads, max_requests, scratch_block, self._sm_count(k_cache.device),
                        block_table_width, q_dtype)

    def bind(self, meta: AttentionMetadata, kv_caches: list[KVCache]) -> TritonBoundAttention:
        device = kv_caches[0][0].device
        if device.type != "cuda":
            raise ValueError(f"attention backend 'triton' needs CUDA caches, got device {device}")
        return TritonBoundAttention(meta, kv_caches, self._sm_count(device))
