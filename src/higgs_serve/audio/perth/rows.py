"""How windows of different lengths share one padded batch for PerTh's mark, each getting the
change it gets alone (docs/architecture.md#the-watermark-stage). NumPy and integers only.

Alone, a window of n samples is marked on a centred STFT: frames every HOP samples from its
first sample, its edges reflected (N_FFT // 2 samples each side), 1 + n // HOP frames; a window
of at most N_FFT // 2 samples first gets silence before it (the reflection needs more samples
than the edge). Its mark depends on where the window starts, not only on the audio near each
sample: the frame mask's threshold is 5 % of the window's loudest frame, the first frames read
the reflected edge, the convolutions see zeros beyond the first frame, and the inverse STFT
normalises the first samples by the frames that exist. So padding a window with anything, its
own earlier audio included, changes its mark; instead each row of a batch is laid out as

    [ zeros | the reflected left edge | the window | the reflected right edge ]

right-aligned on the frame grid: the row's last T frames are exactly the window's T frames
alone, and a per-row `valid` mask marks them. The network then treats frames where `valid` is 0
as absent (audio/perth/network.py `mark_change`): they neither set the mask's threshold nor reach the
convolutions nor count in the inverse STFT's normalisation.

A row of T_b frames is HOP·(T_b − 1) + N_FFT samples; its change comes back as HOP·T_b samples,
the window's own change at `span` within it. (On the CPU every window is its own batch of its
own length, perth/runner.py says why: no padding there, the same layout.)
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

N_FFT = 1536  # 64 ms at 24 kHz: the trained 2048 points at 32 kHz (audio/perth/network.py)
HOP = 240  # 10 ms
EDGE = N_FFT // 2  # samples reflected at each end by the centred STFT
MIN_WINDOW = EDGE + 1  # shorter windows get silence before them first
# The shortest captured bucket: a stream's first two windows (5 and 9 frames) share it.
LADDER_START_FRAMES = 16


def window_frames(num_samples: int) -> int:
    """STFT frames of a window of `num_samples` marked alone."""
    return 1 + max(num_samples, MIN_WINDOW) // HOP


def row_samples(frames: int) -> int:
    """Samples of a row of `frames` STFT frames (the frames' span, edges included)."""
    return HOP * (frames - 1) + N_FFT


def bucket_frames(longest_frames: int, ladder: Sequence[int] = ()) -> int:
    """The frames of a batch whose longest window has `longest_frames`: the smallest of the
    ascending `ladder` (captured lengths) that holds it, else the length itself."""
    i = bisect.bisect_left(ladder, longest_frames)
    return ladder[i] if i < len(ladder) else longest_frames


def length_ladder(max_window_samples: int) -> tuple[int, ...]:
    """Bucket lengths up to a window of `max_window_samples`: LADDER_START_FRAMES doubled until
    one holds it (16, 32, 64, 128 for the shipped profiles' 1.22 s windows: 123 frames)."""
    ladder = [LADDER_START_FRAMES]
    while ladder[-1] < window_frames(max_window_samples):
        ladder.append(2 * ladder[-1])
    return tuple(ladder)


def fill_rows(windows: Sequence[np.ndarray], rows: np.ndarray, valid: np.ndarray) -> list[tuple[int, int]]:
    """Lay `windows` ([n_i] float32 each) into `rows` [B_b, row_samples(T_b)] and `valid`
    [B_b, T_b] (B_b ≥ len(windows); T_b ≥ every window's frames), in place. Returns each
    window's span (start, end) in the change the batch gives back ([B_b, HOP·T_b]). Rows past
    the windows are only marked invalid: each row is computed on its own, so what they still
    hold changes nothing."""
    frames = valid.shape[1]
    if rows.shape[1] != row_samples(frames) or len(windows) > len(rows):
        raise ValueError(f"rows {rows.shape} and valid {valid.shape} do not hold {len(windows)} windows")
    valid[len(windows):] = 0.0
    spans = []
    for i, window in enumerate(windows):
        window = np.asarray(window, dtype=np.float32)
        n = window.size
        if n < MIN_WINDOW:
            window = np.concatenate([np.zeros(MIN_WINDOW - n, np.float32), window])
        size = window.size
        own = window_frames(size)
        if own > frames:
            raise ValueError(f"a window of {n} samples needs {own} frames, the batch has {frames}")
        start = HOP * (frames - own)  # the row's first sample of the window's first frame
        right = row_samples(own) - EDGE - size  # reflected samples the last frame reads
        row = rows[i]
        row[:start] = 0.0
        row[start: start + EDGE] = window[EDGE:0:-1]
        row[start + EDGE: start + EDGE + size] = window
        row[start + EDGE + size:] = window[::-1][1: 1 + right]
        valid[i, : frames - own] = 0.0
        valid[i, frames - own:] = 1.0
        spans.append((start + size - n, start + size))
    return spans
