"""A deterministic speech-like signal for tests that need voiced audio without a TTS engine:
a glottal pulse train with a gliding pitch, shaped by three formant resonances, in syllables of
~200 ms with pauses between words. Not speech, but what the watermark sees in speech: harmonics
below 2 kHz that come and go, and silences."""

from __future__ import annotations

import numpy as np

SAMPLE_RATE_HZ = 24_000


def speechlike(seconds: float, seed: int = 0) -> np.ndarray:
    """[round(seconds * 24000)] float32, peak 0.5."""
    rng = np.random.default_rng(seed)
    n = int(round(seconds * SAMPLE_RATE_HZ))
    t = np.arange(n) / SAMPLE_RATE_HZ
    f0 = 140 + 40 * np.sin(2 * np.pi * 0.7 * t + rng.uniform(0, 6)) + 20 * np.sin(2 * np.pi * 3.1 * t)
    pulses = np.diff(np.floor(np.cumsum(f0 / SAMPLE_RATE_HZ)), prepend=0.0)  # one impulse a period
    source = pulses + 0.02 * rng.standard_normal(n)
    # formants applied in the frequency domain: |H(f)| = a sum of resonance peaks, with the
    # glottal source's -12 dB/octave tilt
    freqs = np.fft.rfftfreq(n, 1 / SAMPLE_RATE_HZ)
    shape = np.zeros_like(freqs)
    for formant, width in ((rng.uniform(500, 800), 80), (rng.uniform(1100, 1800), 120), (2600, 200)):
        shape += 1.0 / (1.0 + ((freqs - formant) / width) ** 2)
    shape /= 1.0 + (freqs / 300.0) ** 2
    voiced = np.fft.irfft(np.fft.rfft(source) * shape, n)
    syllables = np.clip(np.sin(2 * np.pi * 2.5 * t) * 1.5, 0, 1) ** 2  # ~200 ms on, gaps between
    words = (np.sin(2 * np.pi * 0.4 * t + rng.uniform(0, 6)) > -0.7).astype(float)  # pauses
    audio = voiced * syllables * words
    return (0.5 * audio / np.max(np.abs(audio))).astype(np.float32)
