"""Launch tapes: an eager stretch of a step, recorded once per shape, launched again from a list
(docs/architecture.md#launch-tapes).

An eager decode step of the high-throughput profile is ~330 kernel launches and 36 MLP-graph
replays, and nearly all of its host time is Python re-deriving what the previous step of the same
batch size derived: which compiled kernel, its packed arguments, fresh output tensors from the
allocator, views, strides, dtype checks. None of that changes between two steps of one shape:
the weights, the KV pages, the step's input buffers and the MLP graphs' buffers never move, and
the step's intermediates can be given fixed addresses. A tape keeps what the host decided the
first time (the C launcher, grid, stream, kernel handle and every argument, tensors as raw
device pointers) and later steps launch the same kernels in the same order straight from it.

Nothing is captured on the device: every kernel is still launched by the host, one at a time,
each step; the attention kernels read that step's sequence lengths and block tables from the
input buffers, as they do when called op by op. What goes away is the host work a graph would
also have saved, without capturing a graph.

A tape is only trusted when it is complete and its addresses are stable, checked while it is
recorded (`record`):
- every device call in the stretch is either a cached Triton launch (`Launcher` appends it) or a
  call put on the tape with `call` (a CUDA-graph replay); any other op that does device work
  (a torch op, a cuBLAS GEMM, a first launch that compiles) voids the tape;
- every pointer on the tape lies in a tensor that outlives it: the tensors the caller declares
  persistent (weights, KV caches, input buffers, graph buffers), the tape's own inputs and
  outputs, or memory allocated during the recording from the tape pool (a private memory pool
  that only recordings allocate from, so a temporary's block is reused only by another tape's
  temporaries, and tapes run one after the other on one stream).
"""

from __future__ import annotations

import bisect
import gc
import threading
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager, nullcontext

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode


class _Recording(threading.local):
    """The tape this thread is recording, read by Launcher at every launch. Per thread: the codec
    thread launches its own kernels while the engine thread records a step, and those must not
    go on the step's tape."""

    tape: LaunchTape | None = None


recording = _Recording()

# aten ops that allocate or re-view memory and launch nothing on the device: allowed while a tape
# records (allocations are noted as the tape's own memory); every other op voids the tape.
_ALLOCATING = frozenset({"empty.memory_format", "empty_strided.default", "empty_like.default",
                         "new_empty.default", "new_empty_strided.default"})
_VIEWING = frozenset({"view.default", "_unsafe_view.default", "_reshape_alias.default", "slice.Tensor",
                      "select.int", "unsqueeze.default", "squeeze.dim", "squeeze.default", "t.default",
                      "transpose.int", "permute.default", "as_strided.default", "alias.default",
                      "detach.default", "expand.default", "split.Tensor", "split_with_sizes.default",
                      "unbind.int", "narrow.default"})
# ops that return a view when they can and a copy when they cannot (seen whole under inference
# mode): allowed when the result shares its input's memory
_MAYBE_VIEWING = frozenset({"reshape.default", "flatten.using_ints", "contiguous.default", "view_as.default",
                            "reshape_as.default", "expand_as.default"})


class LaunchTape:
    """The launches of one recorded stretch: `replay()` issues them again, in order."""

    def __init__(self, stream: int) -> None:
        self.stream = stream  # the raw CUDA stream every launch was recorded on
        self.entries: list[tuple[Callable, tuple]] = []
        # every device pointer the entries pass, with what passed it (checked once, named when stray)
        self.pointers: list[tuple[int, str]] = []
        self.void_reason: str | None = None
        self.inputs: tuple[Tensor, ...] = ()
        self.outputs: tuple[Tensor, ...] = ()

    def add(self, fn: Callable, args: tuple, pointers: Iterable[tuple[int, str]] = ()) -> None:
        self.entries.append((fn, args))
        self.pointers.extend(pointers)

    def void(self, reason: str) -> None:
        """Mark the tape unusable (the first reason is kept)."""
        if self.void_reason is None:
            self.void_reason = reason

    def replay(self) -> None:
        # the entries call C launchers with the recorded stream: refuse to run beside another one
        if self.stream and torch._C._cuda_getCurrentRawStream(torch._C._cuda_getDevice()) != self.stream:
            raise RuntimeError("a launch tape replayed on another stream than it was recorded on")
        for fn, args in self.entries:
            fn(*args)


def call(fn: Callable[[], None]) -> None:
    """Run `fn()`, a device call that is not a Triton launch (a CUDA-graph replay), and put it on
    the tape being recorded, if any."""
    fn()
    if recording.tape is not None:
        recording.tape.add(fn, ())


class _Guard(TorchDispatchMode):
    """Sees every aten op of the recording: notes allocations, voids the tape on device work."""

    def __init__(self, tape: LaunchTape) -> None:
        super().__init__()
        self.tape = tape
        # [start, end) of every allocation, not the tensor: a temporary must be freed when the
        # eager run frees it, so that the next layer's temporaries take its block
        self.allocated: list[tuple[int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = f"{func._opname}.{func._overloadname}"
        if name in _ALLOCATING:
            self.allocated += spans([out])
        elif name in _MAYBE_VIEWING:
            if not _same_memory(args[0], out):
                self.tape.void(f"aten::{name} copied (its input is not viewable so)")
        elif name not in _VIEWING:
            self.tape.void(f"aten::{name} does device work outside the tape")
        return out


def _same_memory(a: Tensor, b: Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def spans(tensors: Iterable[Tensor]) -> list[tuple[int, int]]:
    """[start, end) of each tensor's whole storage."""
    return [(s.data_ptr(), s.data_ptr() + s.nbytes()) for s in (t.untyped_storage() for t in tensors)]


def _merged(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The spans sorted and merged where they overlap or touch."""
    spans = sorted(spans)
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _outside(pointers: Iterable[tuple[int, str]], ranges: list[tuple[int, int]]) -> list[str]:
    """What passed each pointer that lies in none of `ranges`."""
    starts = [r[0] for r in ranges]
    bad = {}
    for p, where in pointers:
        i = bisect.bisect_right(starts, p) - 1
        if i < 0 or p >= ranges[i][1]:
            bad.setdefault(p, where)
    return list(bad.values())


def record(body: Callable[..., Sequence[Tensor]], inputs: Sequence[Tensor], persistent: Iterable[tuple[int, int]],
           pool=None) -> tuple[tuple[Tensor, ...], LaunchTape]:
    """Run `body(*tape_inputs)` once, eagerly, while recording it; return its outputs and the tape.

    `persistent`: the `spans` of every tensor the body may read or write that outlives the tape
    (weights, caches, buffers). The tape's inputs are copies of `inputs` made inside `pool`: later
    steps copy theirs in with `load` before `replay`. The outputs are whatever body returned (kept alive by the tape).
    Check `tape.void_reason` before keeping the tape: None means it is complete and every pointer
    on it lives as long as the tape (module note)."""
    stream = torch._C._cuda_getCurrentRawStream(torch._C._cuda_getDevice()) if inputs[0].is_cuda else 0
    tape = LaunchTape(stream)
    with _collector_paused(), torch.cuda.use_mem_pool(pool) if pool is not None else nullcontext():
        tape.inputs = tuple(x.clone() for x in inputs)
        guard = _Guard(tape)
        recording.tape = tape
        try:
            with guard:
                outputs = tuple(body(*tape.inputs))
        finally:
            recording.tape = None
    tape.outputs = outputs
    known = _merged([*persistent, *spans([*tape.inputs, *outputs]), *guard.allocated])
    stray = _outside(tape.pointers, known)
    if stray:
        tape.void(f"{len(stray)} pointer(s) outside the persistent tensors and the tape's own memory, "
                  f"first {', '.join(stray[:3])}")
    if not tape.entries:
        tape.void("nothing was launched")
    return outputs, tape


@contextmanager
def _collector_paused():
    """No garbage collection while a recording routes allocations into its pool: a collection
    runs dead objects' finalizers there, and torch 2.11 aborts the process when a MemPool is
    destroyed while any pool routes allocations (an internal assert in its cache release; a GPU
    run of the tape tests died so, collecting an earlier runner)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def load(tape: LaunchTape, inputs: Sequence[Tensor]) -> None:
    """Copy this step's inputs into the tape's input buffers (same shapes as at recording)."""
    for dst, src in zip(tape.inputs, inputs):
        dst.copy_(src)
