"""The paged attention backend interface (the selector by name is `selector.get_backend`).

A backend allocates the per-layer KV cache once, then per step binds the step's metadata to
the caches and returns the `Attention` callable the model calls once per layer:

    attention(layer_idx, q [N, Hq, Dh], k [N, Hkv, Dh], v [N, Hkv, Dh]) -> o [N, Hq, Dh]

which (1) writes the new k/v at `meta.slot_mapping` and (2) computes causal attention of each
request's query tokens over its whole paged context, GQA with Hq / Hkv query heads per KV head,
scale 1/sqrt(Dh), softmax in fp32.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
from torch import Tensor

from higgs_serve.worker.attention.kv_cache_dtype import is_fp8
from higgs_serve.worker.attention.metadata import AttentionMetadata

KVCache = tuple[Tensor, Tensor]  # k_cache, v_cache: [num_blocks, block_size, Hkv, Dh]
# The caches' dtype is the compute dtype of q/k/v, or fp8 (`kv_cache_dtype`): the write casts to
# it, the read casts back (kv_cache_dtype.py).


class Attention(Protocol):
    def __call__(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor: ...

    # The two halves of __call__, for the piecewise graph path: the write is captured inside a
    # graph piece, the attention runs eagerly between two pieces. Neither checks shapes.
    def write(self, layer_idx: int, k: Tensor, v: Tensor) -> None: ...

    def attend(self, layer_idx: int, q: Tensor, out: Tensor | None = None) -> Tensor: ...


class BoundAttention:
    """Base of a backend's per-step `Attention`: `__call__` checks the shapes, then `write`s and
    `attend`s, which each backend implements (the piecewise path calls those two directly)."""

    def __init__(self, meta: AttentionMetadata, kv_caches: list[KVCache]) -> None:
        self.meta = meta
        self.kv_caches = kv_caches
        self._checked = False

    def __call__(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if not self._checked:  # every layer of a step has the same shapes and cache layout
            k_cache, v_cache = self.kv_caches[layer_idx]
            check_qkv(q, k, v, k_cache, v_cache)
            self.check_inputs(q, k, v, k_cache)
            self._checked = True
        self.write(layer_idx, k, v)
        return self.attend(layer_idx, q)

    def check_inputs(self, q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor) -> None:
        """Backend-specific input requirements beyond `check_qkv` (none by default)."""

    def launch_key(self) -> tuple:
        """The host values this step's kernel launches depend on besides the token count and the
        buffers' addresses: two steps with equal keys launch the same kernels with the same
        arguments (worker/eager_tapes.py). By default every host field of the metadata."""
        meta = self.meta
        return meta.num_requests, meta.num_decodes, meta.max_query_len, meta.max_seq_len

    def write(self, layer_idx: int, k: Tensor, v: Tensor) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement write")

    def attend(self, layer_idx: int, q: Tensor, out: Tensor | None = None) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement attend")


class AttentionBackend:
    """Base: KV-cache allocation and argument checks shared by the backends."""

    name = "base"

    def allocate_kv_cache(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> list[KVCache]:
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        # Zero-filled so that never-written pages read as finite numbers (they are masked
        # anyway, but 0 × NaN garbage would still poison a masked dot product).
        return [
            (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(num_layers)
        ]

    def bind(self, meta: AttentionMetadata, kv_caches: list[KVCache]) -> Attention:
        raise NotImplementedError(f"{type(self).__name__} must implement bind")

    def warm_up(self, kv_caches: list[KVCache], num_heads: int, max_requests: int, scratch_block: int,
                block_table_width: int, q_dtype: torch.dtype) -> None:
        """Compile whatever a batch size up to `max_requests` would otherwise compile on live
        traffic (only `scratch_block` of the caches may be touched; q in `q_dtype`, the compute
        dtype, which an fp8 cache does not share). Nothing by default."""


def softmax_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


def check_qkv(q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor) -> None:
    """Shape/dtype agreement between this layer's q/k/v and its cache, with named errors."""
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"q/k/v must be [N, H, Dh], got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ValueError(f"k {tuple(k.shape)} / v {tuple(v.shape)} do not match q {tuple(q.shape)}")
    if q.shape[1] % k.shape[1] != 0:
        raise ValueError(f"query heads {q.shape[1]} not a multiple of KV heads {k.shape[1]}")
    if k_cache.shape != v_cache.shape or k_cache.shape[2:] != k.shape[1:]:
        raise ValueError(
            f"k_cache {tuple(k_cache.shape)} / v_cache {tuple(v_cache.shape)} do not match k {tuple(k.shape)}"
        )
    if k.dtype != q.dtype or v.dtype != q.dtype or k_cache.dtype != v_cache.dtype:
        raise ValueError(f"q/k/v dtypes {q.dtype}/{k.dtype}/{v.dtype} or cache dtypes {k_cache.dtype}/"
                         f"{v_cache.dtype} differ")
    if k_cache.dtype != k.dtype and not is_fp8(k_cache.dtype):
        raise ValueError(f"k/v dtype {k.dtype} differs from the cache dtype {k_cache.dtype} (only an fp8 "
                         f"cache may differ)")

