"""How much the audio looks like speech: what the detector's verdict needs before it may say
"marked" (docs/model.md#what-the-detector-judges).

The watermark's network was trained on speech and answers anything else at random: a 110 Hz
tone scores 0.99, some music 0.96. So detection judges speech only, and this module says whether
there is enough of it, from the signal alone (NumPy; fed in blocks, so a clip of any length takes
a few floats a frame):

- frames of 32 ms every 10 ms at 24 kHz; each frame's energy in 80-4000 Hz (the band every
  input keeps, telephone audio included) and its spectral richness: how many 23 Hz bins of that
  band lie within RICH_SPAN_DB of the frame's strongest (a tone or a chord fills a few; voiced
  speech spreads over its harmonics and formants, unvoiced speech over a noise band);
- over the clip: the active frames (within ACTIVE_SPAN_DB of the clip's loud frames), the
  envelope's depth (the spread of the energy in dB, floored ACTIVE_SPAN_DB under the loud
  frames), and syllable-like dips (a fall of DIP_DB or more with a rise of as much on each side
  within DIP_REACH_FRAMES): speech alternates vowels and consonants a few times a second;
  tones, hum, noise and sustained music do not.

`Evidence.speech_like` holds the calibrated minimum (benchmarks/results/watermark_negatives_calibration_cpu.json).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RATE_HZ = 24_000
FRAME = 768  # 32 ms
HOP = 240  # 10 ms
N_FFT = 1024
BAND_HZ = (80.0, 4000.0)
ACTIVE_SPAN_DB = 35.0  # a frame this far under the clip's loud frames counts as a pause
FLOOR_DBFS = -60.0  # quieter than this is never active (dither, hiss)
RICH_SPAN_DB = 20.0
DIP_DB = 9.0
DIP_REACH_FRAMES = 25  # 250 ms
DIP_SPACING_FRAMES = 8  # two dips at least 80 ms apart
# The minimum before "marked" can be answered (chosen on the calibration split; the results
# README and docs/model.md#what-the-detector-judges give the margins).
MIN_ACTIVE_S = 1.5
MIN_DEPTH_DB = 9.0
MIN_DIPS_PER_S = 0.7
MIN_RICH_BINS = 12.0

_FREQS = np.fft.rfftfreq(N_FFT, 1.0 / RATE_HZ)
_BAND = (_FREQS >= BAND_HZ[0]) & (_FREQS <= BAND_HZ[1])
_WINDOW = np.hanning(FRAME).astype(np.float32)


@dataclass(frozen=True)
class Evidence:
    active_s: float  # seconds of frames that are not pauses
    depth_db: float  # spread of the floored energy envelope
    dips_per_s: float  # syllable-like dips a second of audio
    rich_bins: float  # median spectral richness of the active frames

    @property
    def speech_like(self) -> bool:
        return (self.active_s >= MIN_ACTIVE_S and self.depth_db >= MIN_DEPTH_DB
                and self.dips_per_s >= MIN_DIPS_PER_S and self.rich_bins >= MIN_RICH_BINS)

    def to_json(self) -> dict:
        return {"active_s": round(self.active_s, 2), "depth_db": round(self.depth_db, 2),
                "dips_per_s": round(self.dips_per_s, 2), "rich_bins": round(self.rich_bins, 1),
                "speech_like": self.speech_like}


class SpeechEvidence:
    """Fed 24 kHz audio in order (`push`), then `finish()` -> Evidence."""

    def __init__(self):
        self._tail = np.zeros(0, np.float32)
        self._energy_db: list[np.ndarray] = []  # [t] float32 per block
        self._rich: list[np.ndarray] = []  # [t] int16 per block

    def push(self, samples: np.ndarray) -> None:
        self._tail = np.concatenate([self._tail, np.asarray(samples, dtype=np.float32)])
        frames = (self._tail.size - FRAME) // HOP + 1 if self._tail.size >= FRAME else 0
        if frames == 0:
            return
        index = np.arange(FRAME)[None, :] + HOP * np.arange(frames)[:, None]
        power = np.abs(np.fft.rfft(self._tail[index] * _WINDOW, N_FFT)) ** 2  # [t, bins]
        band = power[:, _BAND]
        self._energy_db.append((10 * np.log10(band.sum(1) / FRAME + 1e-12)).astype(np.float32))
        peak = band.max(1, keepdims=True)
        self._rich.append((band >= peak * 10 ** (-RICH_SPAN_DB / 10)).sum(1).astype(np.int16))
        self._tail = self._tail[frames * HOP:]

    def finish(self) -> Evidence:
        if not self._energy_db:
            return Evidence(0.0, 0.0, 0.0, 0.0)
        energy = np.concatenate(self._energy_db)
        rich = np.concatenate(self._rich)
        loud = float(np.percentile(energy, 99))
        floor = max(loud - ACTIVE_SPAN_DB, FLOOR_DBFS)
        active = energy > floor
        if active.sum() < 2:
            return Evidence(float(active.sum()) * HOP / RATE_HZ, 0.0, 0.0, 0.0)
        envelope = np.maximum(energy, loud - ACTIVE_SPAN_DB)
        return Evidence(active_s=float(active.sum()) * HOP / RATE_HZ,
                        depth_db=float(np.std(envelope)),
                        dips_per_s=_dips(envelope) / (energy.size * HOP / RATE_HZ),
                        rich_bins=float(np.median(rich[active])))


def _dips(envelope: np.ndarray) -> int:
    """Syllable-like dips of a dB envelope [T]: local minima (30 ms smoothing) with a rise of at
    least DIP_DB within DIP_REACH_FRAMES on each side, at least DIP_SPACING_FRAMES apart."""
    smooth = np.convolve(envelope, np.ones(3) / 3, mode="same")
    if smooth.size < 3:
        return 0
    minima = np.flatnonzero((smooth[1:-1] < smooth[:-2]) & (smooth[1:-1] <= smooth[2:])) + 1
    count, last = 0, -DIP_SPACING_FRAMES
    for m in minima:
        before = smooth[max(m - DIP_REACH_FRAMES, 0): m].max()
        after = smooth[m: m + DIP_REACH_FRAMES + 1].max()
        if before - smooth[m] >= DIP_DB and after - smooth[m] >= DIP_DB and m - last >= DIP_SPACING_FRAMES:
            count, last = count + 1, m
    return count
