"""One call marks any list of windows: on CUDA one padded batch (perth/rows.py) replayed as one
graph per (bucket length, batch size) captured at start-up; on the CPU each window alone,
eagerly (docs/architecture.md#the-watermark-stage).

Why alone on the CPU: MKL multiplies matrices with kernels and thread splits chosen by their
width and the thread count (on this project's CPU machine fewer than 12 columns, or 17 to 27 at
four threads and more, round differently), and torch picks its CPU convolution by batch, frames, channels and threads, so a
window computed inside a wider padded batch would get a mark that differs in its last bits with
its companions. Computed at its own length it gets bit for bit the per-length mark it always
had, whatever else is in the call, at any thread count; and batching buys the CPU little.

Why graphs: on a GPU the mark is ~30 small kernels whose launches cost more than their work
(a call cost a fixed ~1.7 ms on an H100 whatever its size, benchmarks/results/README.md), so
the engine's mark stage hands every stream's pending window to one call, and the call replays
one graph. `capture` records, for each bucket length of `rows.length_ladder` and each
batch size of `graph_batches.graph_batch_sizes`, the whole change computation, largest first,
into one shared pool, on the watermark's own stream, after one eager run of each shape (cuDNN
and cuFFT plans). A call whose bucket or batch was not captured (a window longer than the
engine's chunks: `embed` of a whole clip) runs eagerly at its own shape.

Static buffers: one rows buffer and one valid buffer on the device, sized for the largest
bucket and batch, viewed [B, S] / [B, T] by each graph, and pinned host twins for the copies.
Each row is computed on its own (the convolutions, FFTs and reductions never mix rows), so a
batch's extra rows and a row's leading padding change nothing but the time. The graphs of one
pool replay one at a time (the watermark's lock), and a replay's change is copied to the host
before the next replay can overwrite it.

Memory: a batch runs in passes of at most ROWS_PER_PASS rows (inside the graph too), so the
pool holds one pass's intermediates whatever the batch size (`capture` logs and returns its
size). The graphs' cuFFT plans must outlive them: torch's plan cache holds 4,096 plans, these
are two per captured shape.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from higgs_serve.audio.perth.rows import (
    HOP,
    bucket_frames,
    fill_rows,
    length_ladder,
    row_samples,
    window_frames,
)
from higgs_serve.graph_batches import graph_batch_sizes, padded_batch

logger = logging.getLogger(__name__)

ROWS_PER_PASS = 64

# (rows [B, S] float32, valid [B, T] float32) -> [B, HOP·T] float32 change (perth.mark_change)
ChangeFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class MarkRunner:
    """Runs `change` (network.mark_change) over windows laid out by rows.py (the module note)."""

    def __init__(self, change: ChangeFn, device: torch.device, stream: torch.cuda.Stream | None):
        self.change = change
        self.device = device
        self.stream = stream
        self.ladder: tuple[int, ...] = ()  # captured bucket lengths (frames), ascending
        self.batch_sizes: list[int] = []  # captured batch sizes, ascending
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._rows: torch.Tensor | None = None  # flat static input on the device, and its host twin
        self._valid: torch.Tensor | None = None
        self._rows_host: torch.Tensor | None = None
        self._valid_host: torch.Tensor | None = None
        self._change_host: torch.Tensor | None = None
        self.graph_calls = 0  # calls that replayed a graph
        self.eager_calls = 0

    @property
    def graph_shapes(self) -> list[tuple[int, int]]:
        """(bucket frames, batch size) of every captured graph."""
        return sorted(self._graphs)

    # ------------------------------------------------------------------ calls
    def residuals(self, windows: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Each window [n_i] float32 -> its change [n_i] float32: on CUDA one batch per call
        (or one per `max(batch_sizes)` windows when more come); on the CPU one per window."""
        step = 1 if self.stream is None else max(self.batch_sizes, default=0) or max(len(windows), 1)
        out: list[np.ndarray] = []
        for start in range(0, len(windows), step):
            out += self._batch(windows[start: start + step])
        return out

    @torch.inference_mode()
    def _batch(self, windows: Sequence[np.ndarray]) -> list[np.ndarray]:
        frames = bucket_frames(max(window_frames(len(w)) for w in windows), self.ladder)
        batch = padded_batch(self.batch_sizes, len(windows)) if frames in self.ladder else None
        if batch is None:
            rows = np.empty((len(windows), row_samples(frames)), np.float32)
            valid = np.empty((len(windows), frames), np.float32)
            spans = fill_rows(windows, rows, valid)
            change = self._eager(torch.from_numpy(rows), torch.from_numpy(valid))
            self.eager_calls += 1
        else:
            change, spans = self._replay(windows, frames, batch)
            self.graph_calls += 1
        return [change[i, a:b].copy() for i, (a, b) in enumerate(spans)]

    def _eager(self, rows: torch.Tensor, valid: torch.Tensor) -> np.ndarray:
        if self.stream is None:
            return self._passes(rows, valid).numpy()
        with torch.cuda.stream(self.stream):
            return self._passes(rows.to(self.device), valid.to(self.device)).cpu().numpy()

    def _passes(self, rows: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """The change of every row, ROWS_PER_PASS rows at a time (module note: memory)."""
        if len(rows) <= ROWS_PER_PASS:
            return self.change(rows, valid)
        out = torch.empty((len(rows), HOP * valid.shape[1]), dtype=torch.float32, device=rows.device)
        for start in range(0, len(rows), ROWS_PER_PASS):
            part = slice(start, start + ROWS_PER_PASS)
            out[part] = self.change(rows[part], valid[part])
        return out

    def _views(self, frames: int, batch: int) -> tuple[torch.Tensor, ...]:
        """[batch, S] rows and [batch, T] valid views of the device buffers and their host twins."""
        size, width = batch * row_samples(frames), batch * frames
        return (self._rows[:size].view(batch, -1), self._valid[:width].view(batch, frames),
                self._rows_host[:size].view(batch, -1), self._valid_host[:width].view(batch, frames))

    def _replay(self, windows: Sequence[np.ndarray], frames: int, batch: int) -> tuple[np.ndarray, list]:
        rows, valid, rows_host, valid_host = self._views(frames, batch)
        spans = fill_rows(windows, rows_host.numpy(), valid_host.numpy())
        n = len(windows)
        graph, change = self._graphs[(frames, batch)]
        out = self._change_host[: n * HOP * frames].view(n, -1)
        with torch.cuda.stream(self.stream):
            rows[:n].copy_(rows_host[:n], non_blocking=True)
            valid.copy_(valid_host, non_blocking=True)  # the rows past n too: marked invalid
            graph.replay()
            out.copy_(change[:n], non_blocking=True)
        self.stream.synchronize()  # the host buffers are reused by the next call
        return out.numpy(), spans

    # ------------------------------------------------------------------ capture
    @torch.inference_mode()
    def capture(self, max_windows: int, max_window_samples: int) -> dict:
        """Capture every (bucket, batch) the engine can call with (module note); on the CPU
        nothing (returns {}). Returns what it took: graphs, seconds, pool bytes."""
        if self.stream is None:
            return {}
        ladder, batches = length_ladder(max_window_samples), graph_batch_sizes(max_windows)
        top_rows, top_frames = max(batches) * row_samples(max(ladder)), max(batches) * max(ladder)
        self._rows = torch.zeros(top_rows, dtype=torch.float32, device=self.device)
        self._valid = torch.zeros(top_frames, dtype=torch.float32, device=self.device)
        self._rows_host = torch.zeros(top_rows, dtype=torch.float32).pin_memory()
        self._valid_host = torch.zeros(top_frames, dtype=torch.float32).pin_memory()
        self._change_host = torch.zeros(max(batches) * HOP * max(ladder), dtype=torch.float32).pin_memory()
        shapes = sorted(((f, b) for f in ladder for b in batches), reverse=True)
        torch.cuda.synchronize(self.device)
        before = torch.cuda.memory_reserved(self.device)
        t0 = time.perf_counter()
        with torch.cuda.stream(self.stream):
            for frames, batch in shapes:  # eager first: every cuDNN and cuFFT plan exists before capture
                self._passes(*self._views(frames, batch)[:2])
        self.stream.synchronize()
        pool = torch.cuda.graph_pool_handle()
        for frames, batch in shapes:
            rows, valid = self._views(frames, batch)[:2]
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=self.stream):
                change = self._passes(rows, valid)
            self._graphs[(frames, batch)] = (graph, change)
        torch.cuda.synchronize(self.device)
        self.ladder, self.batch_sizes = ladder, list(batches)
        seconds, pool_bytes = time.perf_counter() - t0, torch.cuda.memory_reserved(self.device) - before
        logger.info("captured %d watermark CUDA graphs (bucket frames %s x batch sizes %d-%d) in %.2f s "
                    "(reserved memory %+.1f MiB)", len(self._graphs), list(ladder), min(batches), max(batches),
                    seconds, pool_bytes / 2**20)
        return {"graphs": len(self._graphs), "capture_s": seconds, "pool_bytes": pool_bytes}
