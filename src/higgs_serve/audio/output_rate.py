"""Output sample rates other than the model's 24 kHz (`sample_rate` in a speech request).

The model always generates 24 kHz; a request may ask for another rate (audio/formats.py:
OUTPUT_SAMPLE_RATES, checked there per format) and gets its audio resampled with soxr (a
band-limited resampler), chunk by chunk for every response. soxr's stream resampler keeps its
filter state between chunks, so a stream's samples match the one-shot resampling of the same
audio and, at these rates, every 40 ms frame maps to a whole number of output samples (960 at 24 kHz -> 320 at 8 kHz ... 1920 at 48 kHz).
"""

from __future__ import annotations

import numpy as np
import soxr


def resample(audio: np.ndarray, from_hz: int, to_hz: int) -> np.ndarray:
    """[n] float32 at from_hz -> [m] float32 at to_hz (the same array when the rates are equal)."""
    if from_hz == to_hz:
        return audio
    return soxr.resample(np.asarray(audio, dtype=np.float32), from_hz, to_hz).astype(np.float32)


class StreamResampler:
    """Chunk-by-chunk resampling of one stream; `push(..., last=True)` flushes the filter tail."""

    def __init__(self, from_hz: int, to_hz: int):
        self._stream = (None if from_hz == to_hz
                        else soxr.ResampleStream(from_hz, to_hz, 1, dtype="float32"))

    def push(self, audio: np.ndarray, last: bool) -> np.ndarray:
        if self._stream is None:
            return audio
        return self._stream.resample_chunk(np.asarray(audio, dtype=np.float32), last=last)
