"""The batch sizes captured as CUDA graphs, shared by the codec (codec/codec_graphs.py) and the
watermark (audio/perth/runner.py): a batch between two captured sizes replays the next larger
one, its extra rows computing whatever the static buffers last held (each row is computed on its
own, so they change nothing but the time)."""

from __future__ import annotations

import bisect

# Captured batch sizes: steps of at most 1.5x, so a padded batch wastes at most a third of its
# rows (a quarter on average) and a max_batch_windows of 64 needs 12 graphs a shape, not 64.
_BATCH_LADDER = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def graph_batch_sizes(max_batch: int) -> tuple[int, ...]:
    """The batch sizes captured per shape: the ladder up to `max_batch`, and `max_batch`."""
    return tuple(sorted({b for b in _BATCH_LADDER if b < max_batch} | {max_batch}))


def padded_batch(sizes: list[int], batch: int) -> int | None:
    """The smallest of the captured `sizes` (ascending) that holds `batch` (None: none)."""
    i = bisect.bisect_left(sizes, batch)
    return sizes[i] if i < len(sizes) else None
