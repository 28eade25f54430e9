"""The runner's launch tapes: the eager decoder stack of a step, one tape per step shape
(kernels/launch_tape.py; docs/architecture.md#launch-tapes).

The high-throughput profile runs every decode step's attention half eagerly between the local
MLP graphs, and both profiles run their prefill and mixed steps eagerly. A step of a given shape
is a fixed sequence of launches: the first step of a shape runs eagerly while its tape is
recorded, later steps copy their embeddings and RoPE tables into the tape's inputs and launch
the tape. The shape (the key) is the token count, whether the MLP graphs run, and the host
values the attention backend's launches depend on (`BoundAttention.launch_key`); the runner pads
prefill and mixed steps to a multiple of 8 tokens so that nearby sizes share a tape. Steps past
128 tokens are not taped (their GEMMs run on cuBLAS; from 65 to 128 they run as row blocks on the
skinny kernel, model_runner.TAPE_MAX_ROWS); a shape whose recordings come out void (a profiler's
launch hooks, a GEMM shape the skinny kernel does not take) is tried again a few times, then runs
eagerly for good. At most MAX_TAPES are kept, the least recently used dropped first.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable

import torch
from torch import Tensor

from higgs_serve.kernels import launch_tape
from higgs_serve.kernels.launcher import hooks_set

logger = logging.getLogger(__name__)

MAX_VOID_RECORDINGS = 2  # recordings of one shape that may come out void before it stays eager
MAX_TAPES = 512  # a tape holds a few hundred launch tuples (tens of kB) and no device memory of its own

# Tape pools are never destroyed. torch 2.11 aborts the process when a MemPool dies while any
# thread routes allocations into a pool (measured on the H200: an internal assert in the pool's
# cache release), and a runner's tapes record whenever a new step shape comes, on the engine
# thread, while other runners may be dying on others. A closed EagerTapes hands its pool to the
# next one made on that device instead; two live runners never share one, as their tapes'
# temporaries would overlap.
_SPARE_POOLS: dict[int, list] = {}


def _spare_pools(device_index: int) -> list:
    """The pools closed EagerTapes left on this device (module note)."""
    return _SPARE_POOLS.setdefault(device_index, [])


# body(embeds, cos, sin) -> (hidden before the final norm,)
DecoderBody = Callable[[Tensor, Tensor, Tensor], tuple[Tensor]]


class EagerTapes:
    """Tapes keyed by step shape (module note); one memory pool for them all."""

    def __init__(self, device: torch.device, persistent: Callable[[], Iterable[Tensor]]):
        # the tensors a recording may point into besides its own memory, asked for at the first
        # recording (the MLP graphs' buffers exist only after the start-up capture)
        self._persistent = persistent
        self._spans: list[tuple[int, int]] | None = None
        self._device_index = device.index or 0
        self._pool = None
        if device.type == "cuda":
            spares = _spare_pools(self._device_index)
            self._pool = spares.pop() if spares else torch.cuda.MemPool()
        self._tapes: OrderedDict[tuple, launch_tape.LaunchTape] = OrderedDict()  # least recently used first
        self._voids: dict[tuple, int] = {}
        self.void_reasons: dict[tuple, str] = {}  # the last reason a shape's recording was void
        # how each step given to `run` went (metrics): "replay", "recorded" (op by op while its
        # tape recorded), "void" (recorded, not kept), "op_by_op" (tapes off or the shape stays eager)
        self.outcomes: Counter[str] = Counter()
        self.disabled = False  # set when a replay raised: every step runs op by op from then on

    def run(self, key: tuple, body: DecoderBody, embeds: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """The decoder's output for this step: replayed from the key's tape, or run eagerly (and
        recorded when the key has no tape yet)."""
        inputs = (embeds, cos, sin)
        tape = self._tapes.get(key)
        if hooks_set():  # a profiler's launch hooks see only launches made through Triton
            self.outcomes["op_by_op"] += 1
            return body(*inputs)[0]
        if tape is not None:
            self._tapes.move_to_end(key)
            launch_tape.load(tape, inputs)
            try:
                tape.replay()
            except Exception:  # noqa: BLE001 - a launcher that refuses the tape's arguments
                # Replaying a decode step's stack is idempotent (each launch writes the same values
                # to the same KV slots and buffers), so the step reruns op by op, and so do all
                # later ones: a tape that cannot launch once will not launch at all.
                logger.warning("launch tapes disabled: replaying the tape of %d rows failed", key[0], exc_info=True)
                self.disabled = True
                self._tapes.clear()
                self.outcomes["op_by_op"] += 1
                return body(*inputs)[0]
            self.outcomes["replay"] += 1
            return tape.outputs[0]
        if self.disabled or self._voids.get(key, 0) >= MAX_VOID_RECORDINGS:
            self.outcomes["op_by_op"] += 1
            return body(*inputs)[0]
        if self._spans is None:
            self._spans = launch_tape.spans(self._persistent())
        outputs, tape = launch_tape.record(body, inputs, self._spans, self._pool)
        self.outcomes["recorded" if tape.void_reason is None else "void"] += 1
        if tape.void_reason is None:
            self._tapes[key] = tape
            if len(self._tapes) > MAX_TAPES:
                self._tapes.popitem(last=False)
        else:
            self._voids[key] = self._voids.get(key, 0) + 1
            self.void_reasons[key] = tape.void_reason
            logger.debug("eager step of %d rows not taped: %s", key[0], tape.void_reason)
        return outputs[0]

    def close(self) -> None:
        """Drop every tape and hand the pool on (module note); later steps run op by op."""
        self.disabled = True
        self._tapes.clear()
        pool, self._pool = self._pool, None
        if pool is not None:
            _spare_pools(self._device_index).append(pool)

    def __del__(self) -> None:
        self.close()

    @property
    def replays(self) -> int:
        return self.outcomes["replay"]

    @property
    def keys(self) -> list[tuple]:
        """The step shapes that have a tape: (token rows, MLP graphs, *the attention's launch key)."""
        return sorted(self._tapes)
