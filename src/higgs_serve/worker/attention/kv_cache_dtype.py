"""The KV cache's storage dtype (Stage 0 `kv_cache_dtype`): resolve it, write to it, read from it,
count its bytes.

"auto" stores K/V in the model dtype: the write and the read are no-ops. "fp8" stores
torch.float8_e4m3fn (1 byte: 4 exponent bits, 3 mantissa bits, finite range ±448, no infinity)
with one per-tensor scale of 1.0 for K and for V, vLLM's default when no calibrated scales are
given. Why 1.0 is enough here:
  * K is O(1): Qwen3 RMS-normalizes k per head (k_norm, then its weight) before RoPE, which
    keeps norms, so keys sit in e4m3's normal range (2^-6 .. 448) where a value is rounded to 3
    mantissa bits (relative error <= 2^-4) and a scale would buy nothing.
  * V is not normed (a plain projection of the RMS-normed hidden state), so an outlier past 448
    is possible, if unlikely: the write clamps to ±448 before the cast, so it saturates instead
    of turning into NaN (CUDA's plain float→e4m3 conversion maps out-of-range values to NaN).
The read upcasts to the compute dtype; e4m3 values are exact in bf16/fp16/fp32, so every reader
(the torch reference, the Triton kernels) sees the same numbers. The Triton kernels do the same
cast and clamp inline (triton_paged.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

from higgs_serve.model.hf_config import TextConfig

FP8_E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
_NAMED = {"fp8": torch.float8_e4m3fn}  # kv_cache_dtype values other than "auto" (config-canonical)


def resolve_kv_cache_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """The storage dtype of a validated `kv_cache_dtype` ("auto" = the model dtype)."""
    if name == "auto":
        return model_dtype
    if name not in _NAMED:
        raise ValueError(f"kv_cache_dtype must be 'auto' or one of {sorted(_NAMED)}, got {name!r}")
    return _NAMED[name]


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype == torch.float8_e4m3fn


def to_cache(x: Tensor, cache_dtype: torch.dtype) -> Tensor:
    """New k or v rows in the cache's dtype: unchanged, or clamped to ±448 and cast to e4m3."""
    if x.dtype == cache_dtype:
        return x
    if not is_fp8(cache_dtype):
        raise ValueError(f"KV cache dtype {cache_dtype} differs from k/v dtype {x.dtype} and is not fp8")
    return x.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(cache_dtype)


def from_cache(x: Tensor, dtype: torch.dtype) -> Tensor:
    """Cached k or v in the compute dtype (scale 1.0: a cast, exact for e4m3)."""
    return x if x.dtype == dtype else x.to(dtype)


def byte_view(t: Tensor) -> Tensor:
    """fp8 tensors as uint8 (same bytes): torch's index_copy_ and gathers have no float8 kernels
    on every device, while byte copies are the same operation."""
    return t.view(torch.uint8) if is_fp8(t.dtype) else t


def kv_bytes_per_token(text: TextConfig, cache_dtype: torch.dtype) -> int:
    """Bytes of K and V one token occupies in every layer: 2 × layers × KV heads × head_dim ×
    itemsize (the 4B geometry: 147,456 in bf16, 73,728 in fp8)."""
    return 2 * text.num_layers * text.num_kv_heads * text.head_dim * cache_dtype.itemsize
