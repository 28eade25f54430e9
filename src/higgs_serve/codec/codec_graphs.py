"""CUDA graphs for Stage 1: the whole codec decoder forward, replayed per (window shape, batch).

At batch 1 the decoder is bound by kernel launches (~150 of them: 29 Snakes, ~60 convolutions,
the RVQ dequantise), ~5 ms for the 5-frame first window that sits on time to first audio. One
graph per shape the runner warms up (`chunker.warm_window_shapes` × `graph_batch_sizes`) turns
those launches into one; a batch between two captured sizes replays the next larger one, its
extra rows decoding whatever codes the static buffer last held (each row is decoded on its own,
so they change nothing but the time). A shape is the window length and the frames it keeps: the
graph computes only what those frames need (`decoder.decode_range`). Everything is captured at
start-up, after the eager warm-up has built every cuDNN plan and compiled every Triton kernel,
largest shape first, into one shared memory pool, on the codec's own stream; never lazily on
live traffic. A batch of any other shape (the final window of a stream too short to widen) runs
eagerly.

Each window length has one static codes buffer [max_batch, T, Q] int64 and each shape one static
audio buffer [max_batch, kept frames·hop] float32; batch b reads and writes their first b rows.
The graphs of one pool replay one at a time on the codec thread, so they may share intermediate
memory; the audio a replay leaves is copied to the host before the next replay overwrites it.
"""

from __future__ import annotations

import bisect
import logging
import time

import torch
from torch import Tensor

from higgs_serve.codec.chunker import WindowShape
from higgs_serve.graph_batches import padded_batch

logger = logging.getLogger(__name__)


class CodecGraphs:
    def __init__(self, decoder: torch.nn.Module, device: torch.device, stream: torch.cuda.Stream,
                 num_codebooks: int, samples_per_frame: int):
        self.decoder = decoder
        self.device = device
        self.stream = stream
        self.num_codebooks = num_codebooks
        self.samples_per_frame = samples_per_frame
        self._codes: dict[int, Tensor] = {}  # frames -> [max_batch, T, Q] int64, static input
        self._audio: dict[WindowShape, Tensor] = {}  # -> [max_batch, kept·hop] float32, static output
        self._graphs: dict[tuple[WindowShape, int], torch.cuda.CUDAGraph] = {}  # (shape, batch) -> graph
        self._batches: dict[WindowShape, list[int]] = {}  # shape -> its captured batch sizes, ascending
        self.num_captures = 0
        self.num_replays = 0

    @property
    def shapes(self) -> list[tuple[WindowShape, int]]:
        """(window shape, batch) of every captured graph."""
        return sorted(self._graphs)

    @torch.inference_mode()
    def capture(self, window_shapes: tuple[WindowShape, ...], batch_sizes: tuple[int, ...]) -> dict:
        """Capture the decoder for every window shape × batch size, largest first, into one
        pool. Each shape must have run eagerly before (the runner's warm-up: cuDNN plans, Triton
        compiles). Returns what it took: graphs, seconds, pool bytes."""
        torch.cuda.synchronize(self.device)
        before = torch.cuda.memory_reserved(self.device)
        t0 = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        max_batch = max(batch_sizes)
        for shape in sorted(set(window_shapes), reverse=True):
            if shape.frames not in self._codes:
                self._codes[shape.frames] = torch.zeros(max_batch, shape.frames, self.num_codebooks, dtype=torch.int64,
                                                        device=self.device)
            codes = self._codes[shape.frames]
            audio = self._audio[shape] = torch.zeros(max_batch, shape.kept_frames * self.samples_per_frame,
                                                     dtype=torch.float32, device=self.device)
            for batch in sorted(set(batch_sizes), reverse=True):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=self.stream):
                    audio[:batch].copy_(self.decoder(codes[:batch], shape.keep))  # casts a bf16 decode to float32
                self._graphs[(shape, batch)] = graph
                bisect.insort(self._batches.setdefault(shape, []), batch)
                self.num_captures += 1
        torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - t0
        pool_bytes = torch.cuda.memory_reserved(self.device) - before
        # the change of reserved memory: the eager warm-up's freed cache can make it negative
        logger.info("captured %d codec CUDA graphs for window shapes %s x batch sizes %d-%d in %.2f s "
                    "(reserved memory %+.1f MiB)", len(self._graphs), sorted(set(window_shapes)), min(batch_sizes),
                    max_batch, seconds, pool_bytes / 2**20)
        return {"graphs": len(self._graphs), "capture_s": seconds, "pool_bytes": pool_bytes}

    def serves(self, batch: int, shape: WindowShape) -> bool:
        return padded_batch(self._batches.get(shape, []), batch) is not None

    @torch.inference_mode()  # the static buffers are inference tensors (made in capture)
    def replay(self, codes: Tensor, shape: WindowShape) -> Tensor:
        """codes [B, T, Q] int64 (host or device) of a captured shape -> the audio of its kept
        frames [B, kept·hop] float32 on the device: a view of the static output, valid until the
        next replay. Call it on `stream` (the runner's decode does)."""
        batch, frames, _ = codes.shape
        self._codes[frames][:batch].copy_(codes)
        self._graphs[(shape, padded_batch(self._batches[shape], batch))].replay()
        self.num_replays += 1
        return self._audio[shape][:batch]
