"""Batched per-codebook sampling with a counter-based seeded RNG (SPEC §1.7).

Per request (the same knobs for its 8 codebooks): temperature -> top-k -> top-p -> draw.
Temperature <= 0 or top_k == 1 is greedy: argmax of the masked logits.

Graph-safe by construction: fixed shapes, tensors only, no `.item()`, no boolean indexing, no
Python loop over requests, so `sample_codes` can be captured in a CUDA graph.

Randomness. A draw must depend only on the request's seed and its row index, never on its
batch position or on the other requests. Instead of a stateful generator we hash the counter
(seed, row_index, codebook, vocab index) with splitmix64 into one uniform per vocabulary entry
and draw by Gumbel-max: argmax(logit / T + Gumbel) over the filtered support is exactly a
multinomial draw from the renormalised filtered softmax.

Cross-device determinism. The hash uses int64 torch ops only (wrapping multiply, masked
arithmetic shifts), so the random integers and the uniforms are bit-identical on CPU and CUDA.
Greedy draws are identical. A sampled draw can differ between devices (or batch shapes) only
when float rounding moves a decision boundary: two perturbed scores within one ulp of each
other (`log` may differ by an ulp), or a token whose exclusive cumulative probability lies
within rounding error of top_p (cumsum/softmax reduction order differs across kernels).
"""

from __future__ import annotations

import torch

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


def random_bits(seeds: torch.Tensor, row_index: torch.Tensor, num_codebooks: int,
                vocab_size: int) -> torch.Tensor:
    """seeds, row_index: [B] int64 -> bits: [B, Q, V] int64, a pure function of
    (seed, row_index, codebook, vocab index): identical on every device and batch layout."""
    device = seeds.device
    # The small per-(request, codebook) key first, then one mixing round per vocab entry.
    key = _mix64(seeds.to(torch.int64) + _GOLDEN_GAMMA)  # [B]
    counter = (row_index.to(torch.int64)[:, None] * num_codebooks
               + torch.arange(num_codebooks, device=device)[None, :])  # [B, Q]
    key = _mix64(key[:, None] ^ _mix64(counter + _GOLDEN_GAMMA))  # [B, Q]
    vocab_offsets = (torch.arange(vocab_size, device=device) + 1) * _GOLDEN_GAMMA  # [V]
    return _mix64(key[:, :, None] + vocab_offsets)  # [B, Q, V]


def uniforms(seeds: torch.Tensor, row_index: torch.Tensor, num_codebooks: int,
             vocab_size: int) -> torch.Tensor:
    """[B, Q, V] float32 uniforms in [2^-24, 1 - 2^-24], bit-identical across devices."""
    bits = random_bits(seeds, row_index, num_codebooks, vocab_size)
    k = _shr(bits, 64 - _UNIFORM_BITS)  # top 23 bits
    return (2 * k + 1).to(torch.float32) * (2.0 ** -(_UNIFORM_BITS + 1))


def gumbel_noise(seeds: torch.Tensor, row_index: torch.Tensor, num_codebooks: int,
                 vocab_size: int) -> torch.Tensor:
    """[B, Q, V] float32 standard Gumbel noise, -log(-log(u)); bounded to about [-2.8, 16.6]
    (a tail mass of ~1e-7 per draw is cut, far below any measurable bias)."""
    u = uniforms(seeds, row_index, num_codebooks, vocab_size)
    return -torch.log(-torch.log(u))


def _apply_mask(logits: torch.Tensor, allowed_mask: torch.Tensor | None) -> torch.Tensor:
    if allowed_mask is None:
        return logits
    if allowed_mask.shape != logits.shape:
        raise ValueError(f"allowed_mask shape {tuple(allowed_mask.shape)} != logits shape "
                         f"{tuple(logits.shape)}")
    if allowed_mask.dtype == torch.bool:
        return logits.masked_fill(~allowed_mask, float("-inf"))
    return logits + allowed_mask.to(logits.dtype)  # an additive bias (0 / -inf)


def filter_support(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """scaled: [B, Q, V] logits / temperature (-inf = forbidden); top_k: [B] int (<= 0 or
    >= V: off); top_p: [B] float (>= 1: off) -> keep: [B, Q, V] bool, the sampling support.

    Top-k keeps the k highest entries; top-p then keeps the smallest prefix (by descending
    probability after top-k) whose cumulative probability reaches p. The top entry is always
    kept and forbidden entries never are. Ties are broken by lower vocab index (stable sort).
    """
    vocab_size = scaled.shape[-1]
    sorted_vals, sorted_idx = torch.sort(scaled, dim=-1, descending=True, stable=True)
    rank = torch.arange(vocab_size, device=scaled.device)  # [V]
    k = torch.where(top_k <= 0, vocab_size, top_k).clamp(1, vocab_size)  # [B]
    keep = rank < k[:, None, None]  # [B, Q, V] in sorted order
    probs = torch.softmax(sorted_vals.masked_fill(~keep, float("-inf")), dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs  # exclusive cumulative probability
    p = top_p.to(torch.float32)[:, None, None]
    keep = keep & ((mass_before < p) | (p >= 1.0))
    keep = (keep | (rank == 0)) & (sorted_vals > float("-inf"))
    return torch.zeros_like(keep).scatter(-1, sorted_idx, keep)  # back to vocab order


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
    batch, num_codebooks, vocab_size = logits.shape
    for name, t in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p),
                    ("seeds", seeds), ("row_index", row_index)):
        if t.shape != (batch,):
            raise ValueError(f"{name} must have shape [{batch}], got {tuple(t.shape)}")
    masked = _apply_mask(logits.to(torch.float32), allowed_mask)  # [B, Q, V]
    greedy_codes = masked.argmax(dim=-1)  # [B, Q]

    temperature = temperature.to(torch.float32)
    greedy = (temperature < _MIN_TEMPERATURE) | (top_k == 1)  # [B]
    divisor = torch.where(greedy, torch.ones_like(temperature), temperature)
    scaled = masked / divisor[:, None, None]
    keep = filter_support(scaled, top_k, top_p)
    noise = gumbel_noise(seeds, row_index, num_codebooks, vocab_size)
    scores = torch.where(keep, scaled + noise, float("-inf"))
    sampled_codes = scores.argmax(dim=-1)  # [B, Q]
    return torch.where(greedy[:, None], greedy_codes, sampled_codes)
