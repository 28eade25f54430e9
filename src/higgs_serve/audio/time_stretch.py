"""Time stretch without pitch change (WSOLA), for the speech API's `speed` field.

Higgs-Audio V3 has no native speed control, so `speed` is applied after synthesis
(`TimeStretcher`: piece by piece, in bounded memory; the server answers such a request as one
file, docs/api.md#streaming). WSOLA (waveform-similarity overlap-add): output frames are laid
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
    stretcher = TimeStretcher(speed)
    return np.concatenate([stretcher.push(audio), stretcher.close()])


class TimeStretcher:
    """`time_stretch` fed piece by piece: push returns the output samples that no later input can
    change, close the rest; the pieces join to exactly `time_stretch` of the whole signal (the
    same frames, the same sums in the same order). Holds about two frames of input and output,
    so a long response is stretched in bounded memory. The output length, round(n / speed),
    needs n: what push returns never passes round(received / speed)."""

    def __init__(self, speed: float):
        if not MIN_SPEED <= speed <= MAX_SPEED:
            raise ValueError(f"speed must be in [{MIN_SPEED}, {MAX_SPEED}], got {speed}")
        self.speed = speed
        self._hop_in = _HOP_OUT * speed
        self._lead = int(round(self._hop_in))
        # `padded` of the whole version (zeros, signal, zeros) from index _in_base on
        self._input = np.zeros(_TOLERANCE + self._lead, np.float32)
        self._in_base = 0
        self._received = 0
        # `out` of the whole version from index _out_base on; result = out[_HOP_OUT:][:n_out]
        self._out = np.zeros(_FRAME, np.float32)
        self._out_base = 0
        self._emitted = 0  # result samples returned
        self._frame = 0  # the next frame to lay down
        self._position = _TOLERANCE
        self._closed = False
        self._window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(_FRAME) / _FRAME)).astype(np.float32)

    def push(self, audio: np.ndarray) -> np.ndarray:
        audio = np.asarray(audio, dtype=np.float32)
        self._received += audio.shape[0]
        if self.speed == 1.0:
            return audio.copy()
        self._input = np.concatenate([self._input, audio])
        self._lay_frames(num_frames=None)
        return self._take(int(round(self._received / self.speed)))

    def close(self) -> np.ndarray:
        if self._closed or self.speed == 1.0:
            self._closed = True
            return np.zeros(0, np.float32)
        self._closed = True
        n_out = int(round(self._received / self.speed))
        if self._received == 0:
            return np.zeros(0, np.float32)
        self._input = np.concatenate([self._input, np.zeros(
            2 * _FRAME + 2 * _TOLERANCE + self._lead, np.float32)])
        self._lay_frames(num_frames=(n_out + _HOP_OUT) // _HOP_OUT + 1)
        return self._take(n_out)

    def _lay_frames(self, num_frames: int | None) -> None:
        """Lay down every frame whose input is here (all up to num_frames once closed)."""
        available = self._in_base + self._input.shape[0]  # padded samples known
        while num_frames is None or self._frame < num_frames:
            k = self._frame
            nominal = _TOLERANCE + int(round(k * self._hop_in))
            natural = self._position + _HOP_OUT
            needed = max(nominal + _TOLERANCE, natural) + _FRAME if k > 0 else nominal + _FRAME
            if num_frames is None and needed > available:
                return
            if k > 0:
                self._position = _best_offset(self._input, nominal - self._in_base,
                                              natural - self._in_base) + self._in_base
            else:
                self._position = nominal
            start = k * _HOP_OUT - self._out_base
            if start + _FRAME > self._out.shape[0]:
                self._out = np.concatenate([self._out, np.zeros(
                    start + _FRAME - self._out.shape[0], np.float32)])
            local = self._position - self._in_base
            self._out[start:start + _FRAME] += self._window * self._input[local:local + _FRAME]
            self._frame += 1
            self._drop_consumed_input()

    def _drop_consumed_input(self) -> None:
        """Forget input no later frame reads (in blocks, so the copies stay rare)."""
        nominal = _TOLERANCE + int(round(self._frame * self._hop_in))
        keep_from = min(nominal - _TOLERANCE, self._position + _HOP_OUT)
        if keep_from - self._in_base >= 8 * _FRAME:
            self._input = self._input[keep_from - self._in_base:].copy()
            self._in_base = keep_from

    def _take(self, limit: int) -> np.ndarray:
        """Result samples now final (before the next frame's start), at most `limit` in all."""
        final_out = self._frame * _HOP_OUT  # out samples no later frame adds to
        end = min(final_out - _HOP_OUT, limit)  # in result samples
        if end <= self._emitted:
            return np.zeros(0, np.float32)
        lo = _HOP_OUT + self._emitted - self._out_base
        hi = _HOP_OUT + end - self._out_base
        piece = self._out[lo:hi].copy()
        self._emitted = end
        if lo >= 8 * _FRAME:  # forget output already returned
            self._out = self._out[hi:].copy()
            self._out_base += hi
        return piece


def _best_offset(padded: np.ndarray, nominal: int, natural: int) -> int:
    """The frame start in [nominal - tol, nominal + tol] most similar to padded[natural:+FRAME]."""
    template = padded[natural:natural + _FRAME]
    region = padded[nominal - _TOLERANCE:nominal + _TOLERANCE + _FRAME]
    # corr[d] = sum_i region[d + i] * template[i], for d = 0 .. 2 * tolerance
    spectrum = np.fft.rfft(region, _FFT_SIZE) * np.conj(np.fft.rfft(template, _FFT_SIZE))
    corr = np.fft.irfft(spectrum, _FFT_SIZE)[:2 * _TOLERANCE + 1]
    return nominal - _TOLERANCE + int(np.argmax(corr))
