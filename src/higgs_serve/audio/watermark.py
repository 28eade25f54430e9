"""The audio watermark: embed in generated audio, detect in any audio (docs/model.md#watermark).

One small interface, `Watermarker`:
- `residuals(windows)`: for each window of unmarked 24 kHz audio, the change that marks it
  (same length; windows are independent, so one call may mix requests and lengths, and a
  window's change does not depend on what else is in the call);
- `prepare(max_windows, max_chunk_samples)`: capture what the engine's calls need before
  traffic (CUDA graphs on a GPU; nothing on the CPU);
- `score(audio)`: 0..1 for one 24 kHz clip, `THRESHOLD` and above meaning marked.

Around it, knowing nothing of the model:
- `embed(wm, audio)`: a whole clip marked in one window;
- `MarkStream`: one stream marked chunk by chunk, causally. Each chunk is marked in a window of
  the stream's previous unmarked samples (up to `context_samples`, none before the first chunk)
  plus the chunk itself, and only the chunk's part of the change is kept. Nothing waits for later
  audio, so a chunk leaves as soon as its own window is computed; against `embed`, only the last
  ~150 ms of each chunk differ, marked without the audio that follows them
  (benchmarks/results/README.md has the detection rates of both);
- `detect(wm, audio, rate_hz)`: resampled to 24 kHz, scored, compared with the threshold.

`load_watermarker` builds the one implementation, PerTh (audio/perth/network.py, torch), or raises
`WatermarkUnavailableError` with one line saying why. This module imports no tensor library:
the engine's mark stage (engine/mark_stage.py) uses `MarkStream` and the protocol only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import soxr

from higgs_serve.errors import WatermarkUnavailableError

WATERMARKS = ("perth",)
# A score of at least this means marked. PerTh's decoder is trained towards 1 for marked and 0
# for unmarked audio (its own wrapper rounds the score, a 0.5 cut). Chosen on calibration clips
# the quality measurement never sees (benchmarks/results/watermark_threshold_cpu.json): no
# unmarked clip under any transformation scored above 0.124 there, and every candidate from
# 0.3 to 0.45 kept the most marked clips under 20 dB noise; 0.4 is about 3x the highest
# unmarked score (docs/model.md#watermark).
THRESHOLD = 0.4


class Watermarker(Protocol):
    name: str
    sample_rate_hz: int
    context_samples: int  # unmarked samples before a chunk that its window includes

    def residuals(self, windows: Sequence[np.ndarray]) -> list[np.ndarray]:
        """[n_i] float32 unmarked audio each -> [n_i] float32 change that marks it."""
        ...

    def prepare(self, max_windows: int, max_chunk_samples: int) -> dict:
        """Get ready for calls of up to `max_windows` windows of chunks of up to
        `max_chunk_samples` (plus `context_samples`); returns what it took (for the log)."""
        ...

    def score(self, audio: np.ndarray) -> float:
        """[n] float32 at `sample_rate_hz` -> 0..1 (>= THRESHOLD: marked)."""
        ...


@dataclass(frozen=True)
class Detection:
    detected: bool
    score: float


def load_watermarker(name: str = "perth", device: str = "cpu", dummy: bool = False) -> Watermarker:
    """The named watermark on a torch `device`, or WatermarkUnavailableError saying why not.
    `dummy`: its network with random weights of the trained geometry (`--load-format dummy`:
    the same cost on a device where the trained weights are not installed; the mark it makes is
    no mark the detector knows)."""
    if name not in WATERMARKS:
        raise WatermarkUnavailableError(f"unknown watermark {name!r}; available: {', '.join(WATERMARKS)}")
    from higgs_serve.audio.perth.network import PerthWatermarker  # torch: loaded only when a mark is wanted

    return PerthWatermarker.load(device, dummy=dummy)


def check_available(name: str = "perth") -> None:
    """Raise WatermarkUnavailableError unless `name`'s model can be found (cheap: no load)."""
    if name not in WATERMARKS:
        raise WatermarkUnavailableError(f"unknown watermark {name!r}; available: {', '.join(WATERMARKS)}")
    from higgs_serve.audio.perth.network import find_checkpoint

    find_checkpoint()


def embed(wm: Watermarker, audio: np.ndarray) -> np.ndarray:
    """A whole clip [n] float32 at 24 kHz, marked in one window."""
    audio = np.asarray(audio, dtype=np.float32)
    if audio.size == 0:
        return audio
    return audio + wm.residuals([audio])[0]


def detect(wm: Watermarker, audio: np.ndarray, rate_hz: int) -> Detection:
    """[n] float32 mono at `rate_hz` -> whether it carries the mark, and the score."""
    audio = np.asarray(audio, dtype=np.float32)
    if rate_hz != wm.sample_rate_hz:
        audio = soxr.resample(audio, rate_hz, wm.sample_rate_hz).astype(np.float32, copy=False)
    score = wm.score(audio)
    return Detection(score >= THRESHOLD, score)


class MarkStream:
    """One stream's causal chunk-by-chunk marking (the module note). One producer per stream:
    `window` is called in chunk order; `apply` may run later, on another thread."""

    def __init__(self, context_samples: int):
        self.context_samples = context_samples
        # the last unmarked samples (at most context_samples), for the next window; none before
        # the first chunk, whose window is then the chunk alone: the cheapest call, which is the
        # one time to first audio waits for (a 40 ms chunk: 5 STFT frames instead of 27)
        self._context = np.zeros(0, dtype=np.float32)

    def window(self, chunk: np.ndarray) -> np.ndarray:
        """The window that marks `chunk`: [min(context so far, context_samples) + n] float32;
        advances the context."""
        window = np.concatenate([self._context, np.asarray(chunk, dtype=np.float32)])
        self._context = window[max(window.size - self.context_samples, 0):]
        return window

    @staticmethod
    def apply(chunk: np.ndarray, residual: np.ndarray) -> np.ndarray:
        """`chunk` plus its part (the end) of its window's residual."""
        if chunk.size == 0:
            return chunk
        return (chunk + residual[-chunk.size:]).astype(np.float32, copy=False)

