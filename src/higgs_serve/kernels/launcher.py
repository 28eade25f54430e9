"""Host-cheap launches of the project's Triton kernels.

Eager steps (the high-throughput profile's attention half, the low-latency profile's prefill,
the eager codec) are host-bound: a kernel's GPU time is a few microseconds, its launch through
`kernel[grid](...)` 14-22 us of host time on the H200 host. Most of that is Triton re-deriving on
every call what it derived on the last one: binding the arguments, the specialization key,
`str(options)`, the check that no global the kernel read has changed, launch metadata for its
(empty) hook chains. Measured in one process (benchmarks/results/launch_overhead_*_h200.txt): an
RMSNorm launch takes 16.3 us through Triton, 10.0 us through this cache.

`Launcher(kernel)` remembers, per call signature, the compiled kernel Triton ran for it, and
later calls with the same signature go straight to that kernel's C launcher. The signature must
tell apart every two calls Triton would compile differently, or a call would run a kernel built
for other arguments (one that assumes a 16-byte alignment the pointer lacks, say). Triton 3.6
specializes a tensor on its dtype and on `data_ptr() % 16 == 0`, an int on `== 1`, `% 16 == 0`
and its i32/i64/u64 range, and takes constexprs and launch options by value. The signature here
holds each tensor's dtype and `data_ptr() % 16`, every other argument by type and value, and the
keyword arguments by name and value: at least as fine as Triton's key, so at worst two signatures
share one compiled kernel (tests/unit/test_launcher.py checks this against Triton's specializer).

Falls back to the plain launch, every call, where the fast path cannot be trusted: Triton's
interpreter (CPU), launch hooks set (a profiler such as proton), an unhashable argument, or more
than MAX_SIGNATURES signatures for one kernel (arguments that change value every call).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from higgs_serve.kernels import launch_tape

try:
    import triton
    from triton import knobs
    from triton.runtime.jit import JITFunction
except ImportError:  # CPU-only installs
    triton = None

MAX_SIGNATURES = 1024
_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.lru_cache(maxsize=None)
def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1): block sizes and paddings of launches."""
    return 1 << max(0, n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for grids: `triton.cdiv` is a constexpr function in Triton 3.6, whose call
    unwraps its arguments through a list and a dict (~2 us a launch on the H200 host)."""
    return -(-a // b)


def signature(args: tuple, meta: dict[str, Any]) -> tuple:
    """The cache key of one call (module note): tensors by dtype and alignment, ints by value,
    anything else by type and value (True == 1 == 1.0 in Python; Triton types them apart)."""
    return tuple([(a.dtype, a.data_ptr() & 15) if isinstance(a, torch.Tensor) else
                  a if a.__class__ is int else (a.__class__, a) for a in args]), tuple(meta.items())


def hooks_set() -> bool:
    """Whether a launch hook is registered (a profiler such as proton): the fast path calls none.
    Triton 3.6 keeps each hook as a chain, empty unless something registered."""
    if triton is None:
        return False
    runtime = knobs.runtime
    enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
    return bool(enter is not None and getattr(enter, "calls", True)) or \
        bool(leave is not None and getattr(leave, "calls", True))


class Launcher:
    """`Launcher(kernel)(grid, *args, **meta)` does what `kernel[grid](*args, **meta)` does:
    positional arguments are the kernel's leading runtime parameters, keywords its constexprs
    and launch options (num_warps, launch_pdl, ...)."""

    def __init__(self, kernel):
        self.kernel = kernel
        self._fast = triton is not None and not _INTERPRETED and isinstance(kernel, JITFunction)
        self._names = [p.name for p in kernel.params] if self._fast else []
        self._defaults = {p.name: p.default for p in kernel.params if p.has_default} if self._fast else {}
        self._compiled: dict[tuple, tuple] = {}

    def __call__(self, grid: tuple[int, ...], *args, **meta) -> None:
        if self._fast and not hooks_set():
            device = torch._C._cuda_getDevice()
            try:
                key = (device, signature(args, meta))
                entry = self._compiled.get(key)
            except TypeError:  # an unhashable argument: Triton's own path handles it
                entry = key = None
            if entry is not None:
                launch, function, head, tail = entry
                launch_args = (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
                               torch._C._cuda_getCurrentRawStream(device), function, *head)
                launch(*launch_args, *args, *tail)
                if launch_tape.recording.tape is not None:
                    _tape(self.kernel, launch, launch_args, args, tail)
                return
            compiled = self.kernel[grid](*args, **meta)
            if key is not None and len(self._compiled) < MAX_SIGNATURES:
                self._remember(key, compiled, len(args), meta)
        else:
            self.kernel[grid](*args, **meta)
        if launch_tape.recording.tape is not None:  # a launch through Triton's own path: not taped
            name = getattr(self.kernel, "__name__", "a kernel")
            launch_tape.recording.tape.void(f"{name} launched outside the launch cache")

    def _remember(self, key: tuple, compiled, num_args: int, meta: dict[str, Any]) -> None:
        """Store what the C launcher needs after the positional arguments: the remaining
        parameters' values in declaration order (Triton passes every bound argument, constexprs
        included)."""
        if not (hasattr(compiled, "run") and hasattr(compiled, "function")):
            return
        tail = []
        for name in self._names[num_args:]:
            if name in meta:
                tail.append(meta[name])
            elif name in self._defaults:
                tail.append(self._defaults[name])
            else:  # a parameter neither passed nor defaulted: Triton would have raised already
                return
        # the launch has run, so the compiled kernel's handles are loaded: keep them, not it
        self._compiled[key] = (*_c_launch(compiled), tuple(tail))


def _tape(kernel, launch, launch_args: tuple, args: tuple, tail: tuple) -> None:
    """Put a cached launch on the tape being recorded, tensors as their device pointers (the C
    launcher takes an int where it would read a tensor's data_ptr; the tape must not keep
    temporaries alive)."""
    name = getattr(kernel, "__name__", "kernel")
    pointers = [(a.data_ptr(), f"{name} arg {i} {tuple(a.shape)}") for i, a in enumerate(args)
                if isinstance(a, torch.Tensor)]
    flat = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)
    launch_tape.recording.tape.add(launch, (*launch_args, *flat, *tail), pointers)


def _c_launch(compiled) -> tuple:
    """(launch, function, head): `launch(gx, gy, gz, stream, function, *head, *args)` launches
    the compiled kernel. Where it needs no scratch memory (the kernels here), that is the C
    launcher itself with the arguments Triton's Python wrapper (`CudaLauncher.__call__`) would
    add: cooperative-grid and PDL flags, no scratch buffers, packed metadata, no hooks. Its
    Python frame and two scratch-allocation closures cost ~1/4 of a cached launch's host time."""
    runner = compiled.run
    c_launch = getattr(runner, "launch", None)
    if c_launch is None or getattr(runner, "global_scratch_size", 1) or getattr(runner, "profile_scratch_size", 1):
        return runner, compiled.function, (compiled.packed_metadata, None, None, None)
    return c_launch, compiled.function, (runner.launch_cooperative_grid, runner.launch_pdl, None, None,
                                         compiled.packed_metadata, None, None, None)
