"""Piecewise CUDA graphs: a whole Stage 0 step, split at its attention kernels.

For a padded token count n the step runs as num_layers + 1 captured pieces with the attention
kernel of layer i launched eagerly between piece i and piece i + 1:

    piece 0      embeddings, RoPE tables, layer 0 up to its q/k/v (KV write included)
    piece i      layer i-1 after attention (o_proj + residual, norm, MLP) and layer i up to q/k/v
    piece L      layer L-1 after attention, final norm, audio head and the sampling state step

Only the attention kernels depend on the step's request layout (how many requests, their query
lengths and contexts), so everything else can replay from a graph for any mix of prefill chunks
and decodes: padded token rows write no K/V (slot -1), belong to no request, and their sampled
rows go to the always-done pad slot. Pieces pass q and the attention output through two static
buffers that never move; everything else they hand on lives in the graphs' shared pool.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from higgs_serve.worker.cuda_graphs import capture_one


@dataclass
class PieceIO:
    """The static buffers between pieces and the eager attention: q in, attention output out."""

    q: Tensor  # [max_tokens, Hq, Dh]
    o: Tensor  # [max_tokens, Hq, Dh]


def build_pieces(backbone, embed: Callable[[], Tensor], positions: Tensor, write_kv, io: PieceIO,
                 finish: Callable[[Tensor], None]) -> list[Callable[[], None]]:
    """The step as a list of callables, run in order with attention i between items i and i+1.

    `embed()` gives the step's input embeddings [n, D]; `write_kv(i, k, v)` stores layer i's new
    K/V; `finish(hidden)` samples from the final-normed hidden states. State passes from one
    piece to the next through a dict (graph pool memory when captured)."""
    layers = backbone.layers
    state: dict[str, Tensor] = {}

    def up_to_attention(i: int) -> None:
        q, k, v = layers[i].pre_attention(state["h"], state["cos"], state["sin"])
        write_kv(i, k, v)
        io.q[: q.shape[0]].copy_(q)

    def after_attention(i: int) -> None:
        h = state["h"]
        # in place from the first sum on, as Qwen3Backbone.forward does (no residual copies)
        h = layers[i].o_proj_residual(io.o[: h.shape[0]], h, h if i else None)
        state["h"] = layers[i].mlp_residual(h, out=h)

    def first() -> None:
        h = embed()
        state["cos"], state["sin"] = backbone.rotary(positions, h.dtype)
        state["h"] = h
        up_to_attention(0)

    def middle(i: int) -> None:
        after_attention(i - 1)
        up_to_attention(i)

    def last() -> None:
        after_attention(len(layers) - 1)
        finish(backbone.norm(state.pop("h")))
        state.clear()

    return [first, *(lambda i=i: middle(i) for i in range(1, len(layers))), last]


class PiecewiseGraphs:
    """One list of piece graphs per padded token count, captured at start-up into one pool."""

    def __init__(self, sizes: tuple[int, ...]):
        self.sizes = sizes
        self.graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}

    def capture_size(self, n: int, pieces_for: Callable[[int], list[Callable[[], None]]], pool, num_warmups: int,
                     stream: torch.cuda.Stream) -> None:
        pieces = pieces_for(n)
        # Warm the whole chain up before capturing any piece: a piece's warm-up run would
        # otherwise hand the next capture eager tensors instead of the previous capture's.
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(num_warmups):
                for piece in pieces:
                    piece()
        torch.cuda.current_stream().wait_stream(stream)
        self.graphs[n] = [capture_one(piece, pool, stream) for piece in pieces]

    def replay(self, n: int, attention: Callable[[int], None]) -> None:
        """Replay size n's pieces with `attention(i)` (layer i, eager) between pieces i and i+1."""
        graphs = self.graphs[n]
        graphs[0].replay()
        for i, graph in enumerate(graphs[1:]):
            attention(i)
            graph.replay()


def run_pieces(pieces: list[Callable[[], None]], attention: Callable[[int], None]) -> None:
    """The same sequence without graphs (CPU tests of the split, and warm-ups)."""
    pieces[0]()
    for i, piece in enumerate(pieces[1:]):
        attention(i)
        piece()
