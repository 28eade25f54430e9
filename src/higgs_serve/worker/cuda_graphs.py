"""CUDA graph policy for Stage 0: the mode is data (an enum) and one dispatcher picks it per step.

Two mutually exclusive paths (SPEC §2.1, seed/deploy_profiles.md):
- MLP graphs (high throughput): attention runs eagerly; each decoder layer's post-attention
  RMSNorm + SwiGLU MLP replays a graph captured per padded batch size.
- Full decode graph (low latency): the whole decode step, audio-embedding feedback, backbone,
  audio head and the delay/sampling state machine, replays as one graph per padded batch size.
Everything is captured at start-up, largest size first, into one shared memory pool. Prefill and
mixed steps, and decode batches above the largest size, run eagerly.
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


@dataclass(frozen=True)
class GraphPolicy:
    """Which graphs exist. `capture_sizes` ascending; empty means no graphs at all."""

    full_decode: bool
    mlp: bool
    capture_sizes: tuple[int, ...]
    num_warmups: int = 1

    def __post_init__(self) -> None:
        if self.full_decode and self.mlp:
            raise ValueError("the full decode graph and the MLP graphs are mutually exclusive")

    @classmethod
    def eager(cls) -> GraphPolicy:
        return cls(full_decode=False, mlp=False, capture_sizes=())

    def dispatch(self, num_tokens: int, is_pure_decode: bool) -> tuple[StepMode, int]:
        """(mode, padded batch size) for a step; only pure decode steps use graphs."""
        if not is_pure_decode or not self.capture_sizes or num_tokens > self.capture_sizes[-1]:
            return StepMode.EAGER, num_tokens
        padded = self.capture_sizes[bisect.bisect_left(self.capture_sizes, num_tokens)]
        if self.full_decode:
            return StepMode.FULL_GRAPH, padded
        if self.mlp:
            return StepMode.MLP_GRAPHS, padded
        return StepMode.EAGER, num_tokens


def _capture(fn: Callable[[], None], pool, num_warmups: int, stream: torch.cuda.Stream) -> torch.cuda.CUDAGraph:
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
    layer i + 1 overwrites it.
    """

    def __init__(self, layers, hidden_size: int, sizes: tuple[int, ...], dtype: torch.dtype, device: torch.device):
        self.layers = layers
        self.sizes = sizes
        max_n = sizes[-1]
        self.inp = torch.zeros(max_n, hidden_size, dtype=dtype, device=device)
        self.out = torch.zeros(max_n, hidden_size, dtype=dtype, device=device)
        self.graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self.padded = 0  # the size the current step replays

    def capture(self, pool, num_warmups: int, stream: torch.cuda.Stream) -> None:
        for n in sorted(self.sizes, reverse=True):
            inp, out = self.inp[:n], self.out[:n]
            per_layer = []
            for layer in self.layers:
                def body(layer=layer, inp=inp, out=out) -> None:
                    out.copy_(layer.mlp_residual(inp))
                per_layer.append(_capture(body, pool, num_warmups, stream))
            self.graphs[n] = per_layer

    def __call__(self, layer_idx: int, h: Tensor) -> Tensor:
        n = h.shape[0]
        self.inp[:n].copy_(h)
        self.graphs[self.padded][layer_idx].replay()
        return self.out[:n]


class FullDecodeGraphs:
    """One whole-decode-step graph per padded batch size; `body(n)` runs the step on the
    runner's static buffers for batch n and writes the packed output rows."""

    def __init__(self, sizes: tuple[int, ...]):
        self.sizes = sizes
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}

    def capture(self, body: Callable[[int], None], pool, num_warmups: int, stream: torch.cuda.Stream) -> None:
        for n in sorted(self.sizes, reverse=True):
            self.graphs[n] = _capture(lambda n=n: body(n), pool, num_warmups, stream)

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
