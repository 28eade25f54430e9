"""`resample` following torchaudio's documented band-limited windowed-sinc interpolation.

Test-only. Written from the documented method (Hann or Kaiser windowed sinc, `lowpass_filter_width`
zero crossings, cutoff `rolloff` times the lower Nyquist rate), computing the filter in the
waveform's dtype like torchaudio does. The product's own implementation is
`higgs_serve.codec.resample` (float64 filter); tests compare the two.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

_DEFAULT_KAISER_BETA = 14.769656459379492


def _filter_bank(o, n, width, rolloff, method, beta, dtype, device):
    cutoff = min(o, n) * rolloff
    half = math.ceil(width * o / cutoff)
    rows = []
    for j in range(n):  # one FIR per output phase
        tap_times = torch.arange(-half, half + o, dtype=dtype, device=device) / o - j / n
        t = (tap_times * cutoff).clamp(-width, width)
        if method == "sinc_interp_hann":
            window = torch.cos(t * math.pi / width / 2) ** 2
        elif method == "sinc_interp_kaiser":
            b = torch.tensor(float(_DEFAULT_KAISER_BETA if beta is None else beta), dtype=dtype, device=device)
            window = torch.i0(b * torch.sqrt(1 - (t / width) ** 2)) / torch.i0(b)
        else:
            raise ValueError(f"Invalid resampling method: {method}")
        arg = t * math.pi
        safe = torch.where(arg == 0, torch.ones_like(arg), arg)
        sinc = torch.where(arg == 0, torch.ones_like(arg), torch.sin(safe) / safe)
        rows.append(sinc * window * (cutoff / o))
    return torch.stack(rows)[:, None, :], half


def resample(waveform, orig_freq, new_freq, lowpass_filter_width=6, rolloff=0.99,
             resampling_method="sinc_interp_hann", beta=None):
    if orig_freq <= 0.0 or new_freq <= 0.0:
        raise ValueError("Original frequency and desired frequecy should be positive")
    if orig_freq == new_freq:
        return waveform
    g = math.gcd(int(orig_freq), int(new_freq))
    o, n = int(orig_freq) // g, int(new_freq) // g
    bank, half = _filter_bank(o, n, lowpass_filter_width, rolloff, resampling_method, beta,
                              waveform.dtype, waveform.device)
    shape = waveform.shape
    x = waveform.reshape(-1, shape[-1])
    y = F.conv1d(F.pad(x, (half, half + o))[:, None], bank, stride=o)
    y = y.transpose(1, 2).reshape(x.shape[0], -1)[:, : math.ceil(n * shape[-1] / o)]
    return y.reshape(*shape[:-1], y.shape[-1])
