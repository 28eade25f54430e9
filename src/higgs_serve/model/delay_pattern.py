"""The MusicGen delay pattern [0..7] (docs/model.md, "Delay pattern"): pure NumPy transforms.

Codebook q lags codebook 0 by q rows. A clip of T frames becomes T + 7 delayed rows: codebook q
holds BOC in rows < q, frame t in row t + q, and EOC in rows >= q + T. The talker emits delayed
rows; the codec consumes frames. NumPy only, so the engine (clone prompts in, rows out) needs no
torch; array-likes (lists, CPU torch tensors) are accepted, results are int64 NumPy arrays. The
geometry (codebooks, vocabulary) defaults to `AudioConfig`'s, the shipped checkpoint's; callers
with a loaded model pass its own.
"""

from __future__ import annotations

import numpy as np

from higgs_serve.model.hf_config import AudioConfig, boc_id, eoc_id

__all__ = ["BOC", "EOC", "CODEBOOK_VOCAB_SIZE", "MAX_DELAY", "NUM_CODEBOOKS", "apply_delay", "boc_id",
           "eoc_id", "frames_until_eoc", "num_complete_frames", "num_output_frames", "revert_delay",
           "rows_to_codec_frames", "sanitize_codes"]

NUM_CODEBOOKS = AudioConfig.num_codebooks
MAX_DELAY = NUM_CODEBOOKS - 1  # extra rows: the last codebook lags by num_codebooks - 1
CODEBOOK_VOCAB_SIZE = AudioConfig.codebook_size  # per codebook: the real codes + BOC + EOC
BOC = boc_id(CODEBOOK_VOCAB_SIZE)
EOC = eoc_id(CODEBOOK_VOCAB_SIZE)


def _as_codes(x, name: str, *, min_rows: int = 0, num_codebooks: int = NUM_CODEBOOKS) -> np.ndarray:
    """Validate a [N, num_codebooks] integer code matrix, returning it as int64."""
    a = np.asarray(x)
    if a.ndim != 2 or a.shape[1] != num_codebooks:
        raise ValueError(f"{name} must have shape [N, {num_codebooks}], got {tuple(a.shape)}")
    if a.dtype.kind not in "iu":
        raise ValueError(f"{name} must be an integer array, got dtype {a.dtype}")
    if a.shape[0] < min_rows:
        raise ValueError(f"{name} needs at least {min_rows} rows, got {a.shape[0]}")
    return a.astype(np.int64, copy=False)


def apply_delay(frames, vocab_size: int = CODEBOOK_VOCAB_SIZE, num_codebooks: int = NUM_CODEBOOKS) -> np.ndarray:
    """frames: [T, Q] -> rows: [T + Q - 1, Q] int64 (BOC for row < q, EOC for row >= q + T)."""
    frames = _as_codes(frames, "frames", num_codebooks=num_codebooks)
    num_frames = frames.shape[0]
    rows = np.full((num_frames + num_codebooks - 1, num_codebooks), eoc_id(vocab_size), dtype=np.int64)
    for q in range(num_codebooks):  # Q slice copies; offline only
        rows[:q, q] = boc_id(vocab_size)
        rows[q:q + num_frames, q] = frames[:, q]
    return rows


def revert_delay(rows, start: int = 0, end: int | None = None, num_codebooks: int = NUM_CODEBOOKS) -> np.ndarray:
    """rows: [N, Q] -> frames [start, end) of the N - Q + 1 complete ones: [T, Q] int64, frame t
    of codebook q = row t + q.

    Nothing is dropped or cleaned: specials stay as they are (see `rows_to_codec_frames`).
    """
    rows = _as_codes(rows, "rows", min_rows=num_codebooks - 1, num_codebooks=num_codebooks)
    end = rows.shape[0] - (num_codebooks - 1) if end is None else end
    return np.stack([rows[start + q:end + q, q] for q in range(num_codebooks)], axis=1)


def num_complete_frames(num_rows: int, num_codebooks: int = NUM_CODEBOOKS) -> int:
    """Frames fully determined by the first `num_rows` delayed rows (streaming)."""
    return max(0, num_rows - (num_codebooks - 1))


def num_output_frames(num_rows: int, finished_naturally: bool) -> int:
    """Frames that reach the codec after `num_rows` rows.

    A natural end (codebook 0 sampled EOC at row R, rows R..R+7 emitted) makes the last
    complete frame the EOC frame, which is dropped: exactly R frames.
    """
    complete = num_complete_frames(num_rows)
    return max(0, complete - 1) if finished_naturally else complete


def frames_until_eoc(rows: np.ndarray, num_frames: int, vocab_size: int = CODEBOOK_VOCAB_SIZE) -> int:
    """Of the first `num_frames` frames, those before the first whose codebook 0 is EOC (the
    end marker carries no audio and is never decoded). Frame t's codebook 0 sits in row t."""
    hits = np.nonzero(rows[:num_frames, 0] == eoc_id(vocab_size))[0]
    return int(hits[0]) if len(hits) else num_frames


def sanitize_codes(frames, vocab_size: int = CODEBOOK_VOCAB_SIZE) -> np.ndarray:
    """Replace any special or invalid code (>= BOC, or < 0) by 0 (a new int64 array). Never
    clamp: clamping would turn EOC (1025) into 1023, a real code."""
    frames = np.asarray(frames, dtype=np.int64)
    return np.where((frames >= boc_id(vocab_size)) | (frames < 0), 0, frames)


def rows_to_codec_frames(rows, finished_naturally: bool, vocab_size: int = CODEBOOK_VOCAB_SIZE) -> np.ndarray:
    """rows: [N, 8] delayed rows of one request -> frames: [T, 8] int64 ready for the codec.

    - revert the delay (N - 7 complete frames; fewer than 7 rows give 0 frames);
    - a natural end drops the final frame (its codebook 0 is EOC): exactly R frames;
    - any frame whose codebook 0 is EOC is dropped in general (the end marker, never audio);
    - any special code still left is replaced by 0 (never clamped).
    """
    rows = _as_codes(rows, "rows")
    if rows.shape[0] < MAX_DELAY:
        return np.zeros((0, NUM_CODEBOOKS), dtype=np.int64)
    frames = revert_delay(rows)
    if finished_naturally and frames.shape[0] > 0:
        frames = frames[:-1]
    frames = frames[frames[:, 0] != eoc_id(vocab_size)]  # offline: data-dependent shape is fine
    return sanitize_codes(frames, vocab_size)
