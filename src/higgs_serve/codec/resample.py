"""Band-limited windowed-sinc resampling in torch (the method torchaudio documents as
`sinc_interp_hann`), so the codec encoder never needs torchaudio.

Method: reduce the two rates by their gcd to `o` input and `n` output samples per block. Output
phase j (0 <= j < n) of block b sits at input time (b + j/n)·o. Each output is a dot product of the
input with a Hann-windowed sinc low-pass whose cutoff is `rolloff · min(o, n)` (in block units) and
which spans `lowpass_filter_width` zero crossings either side. This is a polyphase filter bank
applied with one strided conv1d. The output has ceil(n·length/o) samples.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F


@lru_cache(maxsize=16)
def _kernel(orig: int, new: int, lowpass_filter_width: int, rolloff: float) -> tuple[torch.Tensor, int]:
    """Polyphase kernel [n, 1, 2·half + o] in float64 (cast by the caller), and `half` (taps each side)."""
    g = math.gcd(orig, new)
    o, n = orig // g, new // g
    cutoff = min(o, n) * rolloff  # low-pass cutoff, in cycles per block
    half = math.ceil(lowpass_filter_width * o / cutoff)
    offsets = torch.arange(-half, half + o, dtype=torch.float64) / o  # input tap times within a block
    phases = torch.arange(n, dtype=torch.float64)[:, None] / n  # output times within a block
    t = ((offsets[None, :] - phases) * cutoff).clamp(-lowpass_filter_width, lowpass_filter_width)
    window = torch.cos(t * (math.pi / (2 * lowpass_filter_width))) ** 2  # Hann over ±width zero crossings
    x = t * math.pi
    sinc = torch.where(x == 0, torch.ones_like(x), torch.sin(x) / torch.where(x == 0, torch.ones_like(x), x))
    kernel = sinc * window * (cutoff / o)  # unit DC gain
    return kernel[:, None, :], half


def resample(
    waveform: torch.Tensor, orig_freq: int, new_freq: int, lowpass_filter_width: int = 6, rolloff: float = 0.99
) -> torch.Tensor:
    """Resample the last dim of `waveform` [..., length] from orig_freq to new_freq (Hz, integers).

    Returns [..., ceil(new·length/orig)] in the input's dtype and device.
    """
    if orig_freq <= 0 or new_freq <= 0:
        raise ValueError(f"sample rates must be positive, got {orig_freq} -> {new_freq}")
    if orig_freq == new_freq:
        return waveform
    g = math.gcd(int(orig_freq), int(new_freq))
    o, n = int(orig_freq) // g, int(new_freq) // g
    kernel64, half = _kernel(int(orig_freq), int(new_freq), lowpass_filter_width, float(rolloff))
    kernel = kernel64.to(device=waveform.device, dtype=waveform.dtype)
    lead = waveform.shape[:-1]
    length = waveform.shape[-1]
    flat = waveform.reshape(-1, 1, length)  # [W, 1, length]
    padded = F.pad(flat, (half, half + o))
    out = F.conv1d(padded, kernel, stride=o)  # [W, n, blocks]: phase-major per block
    out = out.transpose(1, 2).reshape(flat.shape[0], -1)  # interleave phases -> time order
    target = math.ceil(n * length / o)
    return out[:, :target].reshape(*lead, target)
