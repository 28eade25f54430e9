"""Time stretch without pitch change (WSOLA), for the speech API's `speed` field.

Higgs-Audio V3 has no native speed control, so `speed` is applied after synthesis to the whole
signal (non-streaming only). WSOLA (waveform-similarity overlap-add): output frames are laid
down every `hop_out` samples; each one is read from the input near `k * hop_out * speed`, at the
offset (within +-tolerance) whose waveform best continues the previous frame, so periods line up
and the pitch is kept. Hann windows at 50 % overlap sum to one, so speed 1.0 reproduces the input.
"""

from __future__ import annotations

import numpy as np

MIN_SPEED = 0.25
MAX_SPEED = 4.0

# At 24 kHz: 1024-sample frames (43 ms) cover a few pitch periods of any voice; the +-256 sample
# search (11 ms) exceeds the longest voice period (~10 ms at 100 Hz).
_FRAME = 1024
_HOP_OUT = _FRAME // 2
_TOLERANCE = 256
_FFT_SIZE = 2048  # >= _FRAME + 2 * _TOLERANCE, so the circular correlation below never wraps


def time_stretch(audio: np.ndarray, speed: float) -> np.ndarray:
    """audio: [n] float32 -> [round(n / speed)] float32, same pitch, `speed` times faster."""
    if not MIN_SPEED <= speed <= MAX_SPEED:
        raise ValueError(f"speed must be in [{MIN_SPEED}, {MAX_SPEED}], got {speed}")
    signal = np.asarray(audio, dtype=np.float32)
    n_out = int(round(signal.shape[0] / speed))
    if speed == 1.0 or signal.shape[0] == 0:
        return signal.copy()
    hop_in = _HOP_OUT * speed
    # Leading pad of hop_in input samples maps to exactly _HOP_OUT output samples, which are cut
    # afterwards: this hides the first frame's fade-in. Trailing pad keeps every read in bounds.
    lead = int(round(hop_in))
    padded = np.concatenate([
        np.zeros(_TOLERANCE + lead, np.float32), signal,
        np.zeros(2 * _FRAME + 2 * _TOLERANCE + lead, np.float32),
    ])
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(_FRAME) / _FRAME)).astype(np.float32)
    num_frames = (n_out + _HOP_OUT) // _HOP_OUT + 1
    out = np.zeros(num_frames * _HOP_OUT + _FRAME, np.float32)
    position = _TOLERANCE  # start of the previous frame in `padded`
    for k in range(num_frames):
        nominal = _TOLERANCE + int(round(k * hop_in))
        if k > 0:
            position = _best_offset(padded, nominal, position + _HOP_OUT)
        else:
            position = nominal
        out[k * _HOP_OUT:k * _HOP_OUT + _FRAME] += window * padded[position:position + _FRAME]
    return out[_HOP_OUT:_HOP_OUT + n_out]


def _best_offset(padded: np.ndarray, nominal: int, natural: int) -> int:
    """The frame start in [nominal - tol, nominal + tol] most similar to padded[natural:+FRAME]."""
    template = padded[natural:natural + _FRAME]
    region = padded[nominal - _TOLERANCE:nominal + _TOLERANCE + _FRAME]
    # corr[d] = sum_i region[d + i] * template[i], for d = 0 .. 2 * tolerance
    spectrum = np.fft.rfft(region, _FFT_SIZE) * np.conj(np.fft.rfft(template, _FFT_SIZE))
    corr = np.fft.irfft(spectrum, _FFT_SIZE)[:2 * _TOLERANCE + 1]
    return nominal - _TOLERANCE + int(np.argmax(corr))
