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
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from higgs_serve.config.deploy import CudaGraphMode, TalkerStageConfig, resolve_graph_mode
from higgs_serve.kernels import launch_tape

logger = logging.getLogger(__name__)


# capture(n, pool, stream): capture one size of one graph kind
CaptureSize = Callable[[int, object, torch.cuda.Stream], None]
_DECODE_GRAPH_MODES = (CudaGraphMode.FULL, CudaGraphMode.LOCAL_MLP)  # graphs per decode batch size


@dataclass(frozen=True)
class CudaGraphDispatcher:
    """Which graphs exist (`mode`, resolved on the machine, and their sizes) and which serves a
    step. `decode_sizes`: batch sizes of the decode mode's graphs (FULL or LOCAL_MLP), which the
    eager steps' sampling tails share; `piecewise_sizes`: token counts of the PIECEWISE graphs;
    both ascending."""

    mode: CudaGraphMode = CudaGraphMode.NONE
    decode_sizes: tuple[int, ...] = ()
    piecewise_sizes: tuple[int, ...] = ()
    num_warmups: int = 1

    def __post_init__(self) -> None:
        if self.decode_sizes and self.mode.decode_mode not in _DECODE_GRAPH_MODES:
            raise ValueError(f"decode graph sizes need a FULL or LOCAL_MLP decode mode, not {self.mode.value}")
        if self.piecewise_sizes and not self.mode.piecewise:
            raise ValueError(f"piecewise graph sizes need a piecewise mode, not {self.mode.value}")

    @classmethod
    def from_config(cls, stage0: TalkerStageConfig, cuda_available: bool) -> CudaGraphDispatcher:
        """The deploy profile's graphs on this machine (graph modes need CUDA)."""
        mode, _ = resolve_graph_mode(stage0, cuda_available)
        compilation = stage0.compilation_config
        return cls(mode=mode,
                   decode_sizes=stage0.decode_capture_sizes if mode.decode_mode in _DECODE_GRAPH_MODES else (),
                   piecewise_sizes=compilation.cudagraph_capture_sizes if mode.piecewise else (),
                   num_warmups=compilation.cudagraph_num_of_warmups)

    def sizes(self, step_mode: CudaGraphMode) -> tuple[int, ...]:
        """The captured sizes of a step mode's graphs."""
        if step_mode is CudaGraphMode.PIECEWISE:
            return self.piecewise_sizes
        return self.decode_sizes if step_mode in _DECODE_GRAPH_MODES else ()

    def dispatch(self, num_tokens: int, is_pure_decode: bool) -> tuple[CudaGraphMode, int]:
        """(step mode, padded size) for a step: a decode-only step tries the decode mode's
        graphs, then the mixed mode's, any other step the mixed mode's; NONE (eager, unpadded)
        when no captured size serves it."""
        modes = (self.mode.decode_mode, self.mode.mixed_mode) if is_pure_decode else (self.mode.mixed_mode,)
        for mode in modes:
            padded = padded_size(self.sizes(mode), num_tokens)
            if padded is not None:
                return mode, padded
        return CudaGraphMode.NONE, num_tokens


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
        self._rows: dict[int, tuple[Tensor, Tensor]] = {}  # n -> (inp[:n], out[:n]), made once
        self._at: dict[int, MLPReplay] = {}

    def capture_size(self, n: int, pool, num_warmups: int, stream: torch.cuda.Stream) -> None:
        inp, out = self.inp[:n], self.out[:n]
        per_layer = []
        for layer in self.layers:
            def body(layer=layer, inp=inp, out=out) -> None:
                # the residual sum is written straight into the static output: no copy a layer
                layer.mlp_residual(inp, out=out)
            per_layer.append(capture_one(body, pool, stream, num_warmups))
        self.graphs[n] = per_layer
        self._at[n] = MLPReplay(self, per_layer)

    def at(self, padded: int) -> MLPReplay:
        """The talker's MLP runner (model/qwen3.py `MLPRunner`) for a step padded to `padded` rows."""
        return self._at[padded]

    def input_rows(self, n: int) -> Tensor:
        return self._views(n)[0]

    def _views(self, n: int) -> tuple[Tensor, Tensor]:
        views = self._rows.get(n)
        if views is None:
            views = self._rows[n] = (self.inp[:n], self.out[:n])
        return views

    def replay(self, graphs: list[torch.cuda.CUDAGraph], layer_idx: int, h: Tensor) -> Tensor:
        inp, out = self._views(h.shape[0])
        if h.data_ptr() != inp.data_ptr():
            inp.copy_(h)
        launch_tape.call(graphs[layer_idx].replay)  # on the launch tape when one is recorded
        return out

    def static_tensors(self) -> list[Tensor]:
        """The buffers every size's graphs read and write (they never move)."""
        return [self.inp, self.out]


class MLPReplay:
    """The MLP graphs of one padded size, as the talker's `MLPRunner`: the size is chosen once,
    by `MLPGraphs.at`, not set on the graphs before a call."""

    def __init__(self, graphs: MLPGraphs, per_layer: list[torch.cuda.CUDAGraph]):
        self._graphs = graphs
        self._per_layer = per_layer

    def input_rows(self, n: int) -> Tensor:
        return self._graphs.input_rows(n)

    def __call__(self, layer_idx: int, h: Tensor) -> Tensor:
        return self._graphs.replay(self._per_layer, layer_idx, h)


class SizedGraphs:
    """One graph of `body(n)` per padded size n, on the runner's static buffers: the whole decode
    step per batch size, or the sampling tail of an eagerly run step per sample count."""

    def __init__(self, sizes: tuple[int, ...]):
        self.sizes = sizes
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}

    def padded(self, n: int) -> int | None:
        """The captured size that serves n, or None above the largest."""
        return padded_size(self.sizes, n)

    def capture_size(self, n: int, body: Callable[[int], None], pool, num_warmups: int,
                     stream: torch.cuda.Stream) -> None:
        self.graphs[n] = capture_one(lambda: body(n), pool, stream, num_warmups)

    def replay(self, n: int) -> None:
        self.graphs[n].replay()


def timed_capture(kind: str, sizes: tuple[int, ...], fn: Callable[[], None], device: torch.device) -> dict:
    """Run the capture `fn` (every size of one kind), log and return its wall time and the memory
    its graph pool took."""
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
