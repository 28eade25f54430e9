"""The MusicGen delay pattern [0..7] (docs/model.md#delay-pattern): constants and pure offline transforms.

Codebook q lags codebook 0 by q rows. A clip of T frames becomes T + 7 delayed rows: codebook q
holds BOC in rows < q, frame t in row t + q, and EOC in rows >= q + T. The talker emits delayed
rows; the codec consumes frames. Everything here is pure (no state, no device assumptions) and
works on any torch device; array-likes (numpy, lists) are accepted and returned as torch tensors.
"""

from __future__ import annotations

import torch

NUM_CODEBOOKS = 8
MAX_DELAY = NUM_CODEBOOKS - 1  # 7 extra rows: the last codebook lags by 7
CODEBOOK_VOCAB_SIZE = 1026  # per codebook: 1024 real codes + BOC + EOC


def boc_id(vocab_size: int = CODEBOOK_VOCAB_SIZE) -> int:
    """Begin-of-codes id: the second-to-last entry of each codebook's vocabulary."""
    return vocab_size - 2


def eoc_id(vocab_size: int = CODEBOOK_VOCAB_SIZE) -> int:
    """End-of-codes id: the last entry of each codebook's vocabulary."""
    return vocab_size - 1


BOC = boc_id()  # 1024
EOC = eoc_id()  # 1025


def _as_codes(x, name: str, *, min_rows: int = 0) -> torch.Tensor:
    """Validate a [N, 8] integer code matrix (any device), returning it as int64."""
    t = torch.as_tensor(x)
    if t.dim() != 2 or t.shape[1] != NUM_CODEBOOKS:
        raise ValueError(f"{name} must have shape [N, {NUM_CODEBOOKS}], got {tuple(t.shape)}")
    if t.dtype.is_floating_point or t.dtype == torch.bool or t.dtype.is_complex:
        raise ValueError(f"{name} must be an integer tensor, got dtype {t.dtype}")
    if t.shape[0] < min_rows:
        raise ValueError(f"{name} needs at least {min_rows} rows, got {t.shape[0]}")
    return t.to(torch.int64)


def apply_delay(frames, vocab_size: int = CODEBOOK_VOCAB_SIZE) -> torch.Tensor:
    """frames: [T, 8] -> rows: [T + 7, 8] int64 (BOC for row < q, EOC for row >= q + T)."""
    frames = _as_codes(frames, "frames")
    num_frames = frames.shape[0]
    rows = torch.full(
        (num_frames + MAX_DELAY, NUM_CODEBOOKS), eoc_id(vocab_size),
        dtype=torch.int64, device=frames.device,
    )
    for q in range(NUM_CODEBOOKS):  # 8 slice copies; offline only
        rows[:q, q] = boc_id(vocab_size)
        rows[q:q + num_frames, q] = frames[:, q]
    return rows


def revert_delay(rows) -> torch.Tensor:
    """rows: [N, 8] -> frames: [N - 7, 8] int64, frame t of codebook q = row t + q.

    Nothing is dropped or cleaned: specials stay as they are (see `rows_to_codec_frames`).
    """
    rows = _as_codes(rows, "rows", min_rows=MAX_DELAY)
    num_frames = rows.shape[0] - MAX_DELAY
    # idx[t, q] = t + q: one gather instead of 8 slices
    idx = (torch.arange(num_frames, device=rows.device)[:, None]
           + torch.arange(NUM_CODEBOOKS, device=rows.device)[None, :])
    return rows.gather(0, idx)


def num_complete_frames(num_rows: int) -> int:
    """Frames fully determined by the first `num_rows` delayed rows (streaming)."""
    return max(0, num_rows - MAX_DELAY)


def num_output_frames(num_rows: int, finished_naturally: bool) -> int:
    """Frames that reach the codec after `num_rows` rows.

    A natural end (codebook 0 sampled EOC at row R, rows R..R+7 emitted) makes the last
    complete frame the EOC frame, which is dropped: exactly R frames.
    """
    complete = num_complete_frames(num_rows)
    return max(0, complete - 1) if finished_naturally else complete


def sanitize_codes(frames: torch.Tensor, vocab_size: int = CODEBOOK_VOCAB_SIZE) -> torch.Tensor:
    """Replace any special or invalid code (>= BOC, or < 0) by 0. Never clamp: clamping
    would turn EOC (1025) into 1023, a real code."""
    special = (frames >= boc_id(vocab_size)) | (frames < 0)
    return torch.where(special, torch.zeros_like(frames), frames)


def rows_to_codec_frames(
    rows, finished_naturally: bool, vocab_size: int = CODEBOOK_VOCAB_SIZE,
) -> torch.Tensor:
    """rows: [N, 8] delayed rows of one request -> frames: [T, 8] int64 ready for the codec.

    - revert the delay (N - 7 complete frames; fewer than 7 rows give 0 frames);
    - a natural end drops the final frame (its codebook 0 is EOC): exactly R frames;
    - any frame whose codebook 0 is EOC is dropped in general (the end marker, never audio);
    - any special code still left is replaced by 0 (never clamped).
    """
    rows = _as_codes(rows, "rows")
    if rows.shape[0] < MAX_DELAY:
        return torch.zeros((0, NUM_CODEBOOKS), dtype=torch.int64, device=rows.device)
    frames = revert_delay(rows)
    if finished_naturally and frames.shape[0] > 0:
        frames = frames[:-1]
    frames = frames[frames[:, 0] != eoc_id(vocab_size)]  # offline: data-dependent shape is fine
    return sanitize_codes(frames, vocab_size)
