"""Batched per-codebook sampling with a counter-based seeded RNG (docs/model.md#sampling).

Per request (the same knobs for its 8 codebooks): temperature -> top-k -> top-p -> draw.
Temperature <= 0 or top_k == 1 is greedy: argmax of the masked logits.

Graph-safe by construction: fixed shapes, tensors only, no `.item()`, no boolean indexing, no
Python loop over requests, so `sample_codes` can be captured in a CUDA graph.

How. One descending sort per (request, codebook) row; top-k and top-p both keep a prefix of
that order, so the support is "the first n sorted entries". The draw is an inverse-CDF
(multinomial) draw: with one uniform u per row, take the first kept entry whose cumulative
probability reaches u times the kept mass. That is exactly sampling from the renormalised
filtered softmax, and it needs one random number per row instead of one per vocabulary entry
(a Gumbel-max draw hashed [B, 8, V] int64 lanes and cost ~2x the whole step on an H200).

Randomness. A draw must depend only on the request's seed and its row index, never on its
batch position or on the other requests. Instead of a stateful generator we hash the counter
(seed, row_index, codebook) with splitmix64 into the uniform.

Cross-device determinism. The hash uses int64 torch ops only (wrapping multiply, masked
arithmetic shifts), so the random integers and the uniforms are bit-identical on CPU and CUDA.
Greedy draws are identical. A sampled draw can differ between devices only when float rounding
moves a decision boundary: u times the kept mass within rounding error (~1e-7) of a cumulative
probability, or a token whose exclusive cumulative probability lies within rounding error of
top_p (softmax/cumsum reduction order differs between CPU and CUDA kernels). Both kernels
reduce each row on its own, so on one device the draw does not depend on the batch layout.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# splitmix64 constants as signed int64 (torch has no uint64 arithmetic); multiplies wrap.
_GOLDEN_GAMMA = 0x9E3779B97F4A7C15 - (1 << 64)
_MIX_MUL_1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX_MUL_2 = 0x94D049BB133111EB - (1 << 64)
_UNIFORM_BITS = 23  # (2k + 1) / 2^24 with k < 2^23 is exact in float32, strictly inside (0, 1)

_MIN_TEMPERATURE = 1e-5  # below this a temperature is treated as greedy


def _shr(x: torch.Tensor, n: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's >> is arithmetic)."""
    return (x >> n) & ((1 << (64 - n)) - 1)


def _mix64(z: torch.Tensor) -> torch.Tensor:
    """splitmix64 finaliser: a bijection on 64-bit patterns with full avalanche."""
    z = (z ^ _shr(z, 30)) * _MIX_MUL_1
    z = (z ^ _shr(z, 27)) * _MIX_MUL_2
    return z ^ _shr(z, 31)


def random_bits(seeds: torch.Tensor, row_index: torch.Tensor, num_codebooks: int) -> torch.Tensor:
    """seeds, row_index: [B] int64 -> bits: [B, Q] int64, a pure function of
    (seed, row_index, codebook): identical on every device and batch layout."""
    key = _mix64(seeds.to(torch.int64) + _GOLDEN_GAMMA)  # [B]
    counter = (row_index.to(torch.int64)[:, None] * num_codebooks
               + torch.arange(num_codebooks, device=seeds.device)[None, :])  # [B, Q]
    return _mix64(key[:, None] ^ _mix64(counter + _GOLDEN_GAMMA))


def uniforms(seeds: torch.Tensor, row_index: torch.Tensor, num_codebooks: int) -> torch.Tensor:
    """[B, Q] float32 uniforms in [2^-24, 1 - 2^-24], bit-identical across devices."""
    k = _shr(random_bits(seeds, row_index, num_codebooks), 64 - _UNIFORM_BITS)  # top 23 bits
    return (2 * k + 1).to(torch.float32) * (2.0 ** -(_UNIFORM_BITS + 1))


def _apply_mask(logits: torch.Tensor, allowed_mask: torch.Tensor | None) -> torch.Tensor:
    if allowed_mask is None:
        return logits
    if allowed_mask.shape != logits.shape:
        raise ValueError(f"allowed_mask shape {tuple(allowed_mask.shape)} != logits shape "
                         f"{tuple(logits.shape)}")
    if allowed_mask.dtype == torch.bool:
        return logits.masked_fill(~allowed_mask, float("-inf"))
    return logits + allowed_mask.to(logits.dtype)  # an additive bias (0 / -inf)


def _sorted_support(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor):
    """scaled: [B, Q, V] logits / temperature (-inf = forbidden); top_k: [B] int (<= 0 or
    >= V: off); top_p: [B] float (>= 1: off).

    Returns (sorted_idx [B, Q, V], cum [B, Q, V], n [B, Q]): the vocab ids in descending order
    (ties: lower id first), the cumulative top-k-renormalised probabilities in that order, and
    the support size: the support is the first n sorted entries. Top-k keeps the k highest;
    top-p then keeps the smallest prefix whose cumulative probability reaches p. The top entry
    is always kept, forbidden entries never are (n >= 1 needs one allowed entry per row).
    """
    vocab_size = scaled.shape[-1]
    sorted_vals, sorted_idx = torch.sort(scaled, dim=-1, descending=True, stable=True)
    rank = torch.arange(vocab_size, device=scaled.device)  # [V]
    k = torch.where(top_k <= 0, vocab_size, top_k).clamp(1, vocab_size).to(torch.int64)[:, None]
    probs = torch.softmax(sorted_vals.masked_fill(rank >= k[:, :, None], float("-inf")), dim=-1)
    cum = torch.cumsum(probs, dim=-1)
    mass_before = F.pad(cum[..., :-1], (1, 0))  # exclusive cumulative probability, monotone
    p = top_p.to(torch.float32)[:, None]  # [B, 1]
    n_p = torch.where(p >= 1.0, vocab_size, (mass_before < p[:, :, None]).sum(-1))
    n_allowed = (sorted_vals > float("-inf")).sum(-1)
    n = torch.minimum(torch.minimum(k, n_p), n_allowed).clamp_min(1)  # [B, Q]
    return sorted_idx, cum, n


def filter_support(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The sampling support as keep: [B, Q, V] bool in vocab order (see `_sorted_support`)."""
    sorted_idx, _, n = _sorted_support(scaled, top_k, top_p)
    rank = torch.arange(scaled.shape[-1], device=scaled.device)
    return torch.zeros_like(sorted_idx, dtype=torch.bool).scatter(
        -1, sorted_idx, rank < n[:, :, None])


def sample_codes(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seeds: torch.Tensor,
    row_index: torch.Tensor,
    allowed_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Draw one code per (request, codebook).

    logits: [B, Q, V] float; temperature, top_p: [B] float; top_k: [B] int; seeds,
    row_index: [B] int64; allowed_mask: [B, Q, V] bool (True = may be drawn) or an additive
    float bias (-inf = forbidden), or None. Returns codes: [B, Q] int64.

    Every (request, codebook) must have at least one allowed entry; forbidden entries are
    never drawn, whatever the filters.
    """
    if logits.dim() != 3:
        raise ValueError(f"logits must be [B, Q, V], got shape {tuple(logits.shape)}")
    batch, num_codebooks, _ = logits.shape
    for name, t in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p),
                    ("seeds", seeds), ("row_index", row_index)):
        if t.shape != (batch,):
            raise ValueError(f"{name} must have shape [{batch}], got {tuple(t.shape)}")
    masked = _apply_mask(logits.to(torch.float32), allowed_mask)  # [B, Q, V]
    greedy_codes = masked.argmax(dim=-1)  # [B, Q]

    temperature = temperature.to(torch.float32)
    greedy = (temperature < _MIN_TEMPERATURE) | (top_k == 1)  # [B]
    divisor = torch.where(greedy, torch.ones_like(temperature), temperature)
    sorted_idx, cum, n = _sorted_support(masked / divisor[:, None, None], top_k, top_p)
    # inverse CDF over the kept prefix: the first position whose cum reaches u * kept mass
    kept_mass = cum.gather(-1, (n - 1)[:, :, None])  # [B, Q, 1]
    target = uniforms(seeds, row_index, num_codebooks)[:, :, None] * kept_mass
    pos = torch.minimum((cum < target).sum(-1), n - 1)  # clamp: u * mass may round up to mass
    sampled_codes = sorted_idx.gather(-1, pos[:, :, None])[:, :, 0]  # [B, Q]
    return torch.where(greedy[:, None], greedy_codes, sampled_codes)
