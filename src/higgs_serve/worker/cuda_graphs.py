"""CUDA graph policy for Stage 0: the mode is data (an enum) and one dispatcher picks it per step.

Two mutually exclusive paths (docs/model.md#deploy-profiles):
- MLP graphs (high throughput): attention runs eagerly; each decoder layer's post-attention
  RMSNorm + SwiGLU MLP replays a graph captured per padded batch size.
- Full decode graph (low latency): the whole decode step, audio-embedding feedback, backbone,
  audio head and the delay/sampling state machine, replays as one graph per padded batch size.
With either, the steps whose forward runs eagerly (the MLP-graph decodes, prefills, mixed steps)
replay their sampling tail (audio head, delay-pattern masks, sampler, audio-state update: ~100
small ops, ~2 ms of host time a step when launched one by one) as a graph per padded sample count
of the same sizes. The forward itself is as the profile says; only the per-row sampling is replayed.
And, as an explicit option beyond the two profiles, piecewise graphs (`worker/piecewise.py`):
the whole step but its attention kernels, per padded token count, for any mix of prefill and
decode; alone, or under the full decode graph for the steps it cannot serve.
Everything is captured at start-up, largest size first, into one shared memory pool. Steps no
graph serves (mixed steps without piecewise graphs, batches above the largest size) run eagerly.
"""

from __future__ import annotations

import bisect
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

logger = logging.getLogger(__name__)


class StepMode(enum.Enum):
    EAGER = "eager"
    MLP_GRAPHS = "mlp_graphs"  # eager step, layer MLPs replayed
    FULL_GRAPH = "full_graph"  # whole decode step replayed
    PIECEWISE = "piecewise"  # everything but the attention kernels replayed


@dataclass(frozen=True)
class GraphPolicy:
    """Which graphs exist. `capture_sizes`: decode batch sizes of the full decode graph or the
    MLP graphs; `piecewise_sizes`: token counts of the piecewise graphs; both ascending."""

    full_decode: bool
    mlp: bool
    capture_sizes: tuple[int, ...]
    num_warmups: int = 1
    piecewise_sizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.full_decode and self.mlp:
            raise ValueError("the full decode graph and the MLP graphs are mutually exclusive")
        if self.mlp and self.piecewise_sizes:
            raise ValueError("the MLP graphs and the piecewise graphs are mutually exclusive")

    @classmethod
    def eager(cls) -> GraphPolicy:
        return cls(full_decode=False, mlp=False, capture_sizes=())

    def dispatch(self, num_tokens: int, is_pure_decode: bool) -> tuple[StepMode, int]:
        """(mode, padded size) for a step: a decode-only step takes the full decode graph or the
        MLP graphs when they serve its size, any step the piecewise graphs when they do."""
        padded = padded_size(self.capture_sizes, num_tokens)
        if is_pure_decode and padded is not None and (self.full_decode or self.mlp):
            return (StepMode.FULL_GRAPH if self.full_decode else StepMode.MLP_GRAPHS), padded
        padded = padded_size(self.piecewise_sizes, num_tokens)
        if padded is not None:
            return StepMode.PIECEWISE, padded
        return StepMode.EAGER, num_tokens


def padded_size(sizes: tuple[int, ...], n: int) -> int | None:
    """The smallest of the ascending captured `sizes` that serves n, or None (none captured, or
    n above the largest)."""
    if not sizes or n > sizes[-1]:
        return None
    return sizes[bisect.bisect_left(sizes, n)]


def capture_one(fn: Callable[[], None], pool, stream: torch.cuda.Stream, num_warmups: int = 0) -> torch.cuda.CUDAGraph:
    """Warm `fn` up eagerly on a side stream, then capture it into `pool`."""
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(num_warmups):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=stream):
        fn()
    return graph


class MLPGraphs:
    """Per-layer post-attention norm + MLP graphs, one set per padded token count.

    All layers of one size share a static input and output buffer: layers run one after the
    other, so the output of layer i has been consumed (added into the next residual) before
    layer i + 1 overwrites it. The attention half writes its result straight into the input
    buffer (`input_rows`): a copy there cost ~1/3 of the graph's own host time a layer, 36 times
    a step.
    """

    def __init__(self, layers, hidden_size: int, sizes: tuple[int, ...], dtype: torch.dtype, device: torch.device):
        self.layers = layers
        self.sizes = sizes
        max_n = sizes[-1]
        self.inp = torch.zeros(max_n, hidden_size, dtype=dtype, device=device)
        self.out = torch.zeros(max_n, hidden_size, dtype=dtype, device=device)
        self.graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self.padded = 0  # the size the current step replays
        self._rows: dict[int, tuple[Tensor, Tensor]] = {}  # n -> (inp[:n], out[:n]), made once

    def capture(self, pool, num_warmups: int, stream: torch.cuda.Stream) -> None:
        for n in sorted(self.sizes, reverse=True):
            inp, out = self.inp[:n], self.out[:n]
            per_layer = []
            for layer in self.layers:
                def body(layer=layer, inp=inp, out=out) -> None:
                    # the residual sum is written straight into the static output: no copy a layer
                    layer.mlp_residual(inp, out=out)
                per_layer.append(capture_one(body, pool, stream, num_warmups))
            self.graphs[n] = per_layer

    def input_rows(self, n: int) -> Tensor:
        return self._views(n)[0]

    def _views(self, n: int) -> tuple[Tensor, Tensor]:
        views = self._rows.get(n)
        if views is None:
            views = self._rows[n] = (self.inp[:n], self.out[:n])
        return views

    def __call__(self, layer_idx: int, h: Tensor) -> Tensor:
        inp, out = self._views(h.shape[0])
        if h.data_ptr() != inp.data_ptr():
            inp.copy_(h)
        self.graphs[self.padded][layer_idx].replay()
        return out


class SizedGraphs:
    """One graph of `body(n)` per padded size n, on the runner's static buffers: the whole decode
    step per batch size, or the sampling tail of an eagerly run step per sample count."""

    def __init__(self, sizes: tuple[int, ...]):
        self.sizes = sizes
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}

    def padded(self, n: int) -> int | None:
        """The captured size that serves n, or None above the largest."""
        return padded_size(self.sizes, n)

    def capture(self, body: Callable[[int], None], pool, num_warmups: int, stream: torch.cuda.Stream) -> None:
        for n in sorted(self.sizes, reverse=True):
            self.graphs[n] = capture_one(lambda n=n: body(n), pool, stream, num_warmups)

    def replay(self, n: int) -> None:
        self.graphs[n].replay()


def timed_capture(kind: str, sizes: tuple[int, ...], fn: Callable[[], None], device: torch.device) -> dict:
    """Run the capture `fn`, log and return its wall time and the memory its graph pool took."""
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_reserved(device)
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    pool = torch.cuda.memory_reserved(device) - before
    logger.info("captured %s CUDA graphs for batch sizes %s in %.2f s (pool %.1f MiB)",
                kind, list(sizes), seconds, pool / 2**20)
    return {"kind": kind, "sizes": list(sizes), "capture_s": seconds, "pool_bytes": pool}
