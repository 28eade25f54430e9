"""Per-request output bookkeeping on the host: delayed rows in, codec windows out.

Rows arrive one per step from Stage 0. The streaming window rule (codec/chunker.py) decides
when enough de-delayed frames exist to hand a window to Stage 1. No tensors here: rows are a
growing int64 numpy array.
"""

from __future__ import annotations

import numpy as np

from higgs_serve.codec.chunker import StreamChunker, Window, WindowParams, widen_final
from higgs_serve.model.delay_pattern import frames_until_eoc, num_complete_frames, revert_delay, sanitize_codes


class OutputStream:
    def __init__(self, params: WindowParams, streaming: bool, num_codebooks: int, codebook_size: int):
        self.chunker = StreamChunker(params, streaming=streaming)
        self.codebook_size = codebook_size
        self._rows = np.zeros((64, num_codebooks), dtype=np.int64)
        self.num_rows = 0

    def append(self, row: tuple[int, ...]) -> None:
        if self.num_rows == len(self._rows):
            self._rows = np.concatenate([self._rows, np.zeros_like(self._rows)])
        self._rows[self.num_rows] = row
        self.num_rows += 1

    @property
    def rows(self) -> np.ndarray:
        """[N, 8] int64: the delayed rows exactly as sampled."""
        return self._rows[: self.num_rows]

    def frames_available(self, finished: bool) -> int:
        """Complete de-delayed frames; once finished, the EOC frame of a natural end is dropped."""
        complete = num_complete_frames(self.num_rows, self._rows.shape[1])
        # the EOC frame (natural end, or the forced end at the frame cap) is never decoded
        return frames_until_eoc(self._rows, complete, self.codebook_size) if finished else complete

    def next_window(self, finished: bool) -> tuple[Window, np.ndarray] | None:
        """The next codec window (if the rule says one is due) and its frames [T, 8]."""
        window = self.chunker.push(self.frames_available(finished), finished)
        if window is None:
            return None
        window = widen_final(window, self.chunker.params)
        return window, self.frames(window.start_frame, window.end_frame)

    def all_frames(self) -> np.ndarray:
        """[T, 8] int64: every frame handed to the codec (specials replaced by 0)."""
        return self.frames(0, self.frames_available(True))

    def frames(self, start: int, end: int) -> np.ndarray:
        """Frames [start, end) as [T, 8] int64: frame t of codebook q is row t + q; any special
        code left (BOC/EOC) becomes 0, never clamped (1025 clamped would be 1023, a real code)."""
        num_codebooks = self._rows.shape[1]
        frames = revert_delay(self._rows, start, end, num_codebooks)
        return sanitize_codes(frames, self.codebook_size)
