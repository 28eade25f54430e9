"""Shared helpers of the issue 28 server tests: a tone clip and a reference encoder that can be
held mid-call."""

from __future__ import annotations

import io
import threading

import numpy as np
import soundfile as sf


def tone_wav(seconds: float, freq_hz: float) -> bytes:
    t = np.arange(int(seconds * 24000)) / 24000
    buffer = io.BytesIO()
    sf.write(buffer, (0.3 * np.sin(2 * np.pi * freq_hz * t)).astype(np.float32), 24000,
             format="WAV", subtype="PCM_16")
    return buffer.getvalue()


class GatedEncoder:
    """A reference encoder whose next call can be held: `entered` is set when it starts, and it
    returns only once `release` is set. Codes encode the clip's length, to tell clips apart."""

    def __init__(self):
        self.entered, self.release = threading.Event(), threading.Event()
        self.release.set()
        self.calls: list[int] = []

    def __call__(self, audio: np.ndarray) -> np.ndarray:
        self.calls.append(audio.shape[0])
        self.entered.set()
        assert self.release.wait(10)
        return np.full((3, 8), audio.shape[0] % 1000, dtype=np.int64)
