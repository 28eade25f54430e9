"""Programmatic dependent launch (PDL) for the talker's Triton kernels.

A decode step at batch 1 is ~470 dependent kernels. Without PDL the GPU drains one grid and
flushes its writes before it even starts placing the next one's programs, so every boundary is
a gap in which no weight byte moves. On Hopper and later, a kernel launched with the
programmatic-serialization attribute may be placed while its predecessor still runs: it loads
what does not depend on the predecessor (a norm's weight), then waits for the predecessor's
results with `griddepcontrol.wait`. Inside a CUDA graph the attribute becomes a programmatic
edge. Measured on an H200 (benchmarks/results/README.md): the full decode graph's GPU time at
B = 1 goes from 3.12 to 2.95 ms, at B = 16 from 3.41 to 3.25 ms; B = 64 is unchanged.

Tried and dropped: the skinny GEMM prefetching the start of its weight slice into L2 (a bulk
prefetch) before its wait. It made the B = 1 step slower (3.26 against 2.95 ms GPU time): the
prefetched lines did not survive until the loop read them, so the prefetch was extra traffic.
A later form, a PDL kernel of its own prefetching the next GEMM's weights (the o weight whole,
21 MB) before the small kernels that precede that GEMM, was slower as well: B = 1 2.74 -> 3.05 ms,
and the more of the weight it fetched the slower the step (one prefetch per line: 4 MB +0.04 ms,
21 MB +0.34 ms), so the lines it brought in bought nothing back in the o GEMM.
Also dropped: the light kernels (norms, RoPE, SiLU, split reduces, KV write, decode attention)
releasing their successor at their start while the GEMMs keep the late release, so that each
GEMM is placed while the small kernel before it runs. GPU time at
B = 1 / 16 / 64: 2.93 / 3.33 / 4.08 ms against 2.96 / 3.27 / 4.13 with the late release
everywhere, within run-to-run spread (step_pdl_early_h200.json and its repeat).

Every kernel launched with PDL follows two rules, which make a chain of them safe:
- each program calls `gdc_wait` (`pdl_wait`) before it reads anything an earlier kernel wrote,
  before it writes anything (an earlier kernel may still be reading it), and before any early
  return. A grid completes only after all its programs waited, so completion is transitive: a
  kernel that waited on its predecessor also sees everything before that one.
- each program calls `gdc_launch_dependents` (`pdl_release`) once its main work is done, just
  before its final stores. The next kernel is placed only once every program of this one has
  made that call (or exited), i.e. all of them are resident, so its programs take SM slots this
  grid no longer needs: no grid waits on one that cannot be placed. Releasing at the start
  instead let a GEMM's programs crowd onto whichever SMs had room while the previous GEMM ran,
  and measured no faster.
Kernels that are not ours (cuBLAS, torch) never start early and are waited for in full.

`enabled(device)` says whether launches on `device` use PDL (Hopper+ with Triton); benchmarks and
tests may switch it off with `set_enabled(False)` to measure the difference. Captured graphs keep
the setting they were captured with.
"""

from __future__ import annotations

import functools

import torch

try:
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # CPU-only installs
    triton = None

_override: bool | None = None


def set_enabled(flag: bool | None) -> None:
    """Force PDL on or off for launches from now on (None: the device decides). For benchmarks
    and tests; a kernel variant per setting is compiled on first use."""
    global _override
    _override = flag


@functools.lru_cache(maxsize=None)
def _supported(device: torch.device) -> bool:
    return triton is not None and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def enabled(device: torch.device) -> bool:
    if not _supported(device):
        return False
    return True if _override is None else _override


def launch_args(device: torch.device) -> dict[str, bool]:
    """Keyword arguments for a Triton launch of a kernel that takes `USE_PDL: tl.constexpr`."""
    flag = enabled(device)
    return {"USE_PDL": flag, "launch_pdl": flag}


if triton is not None:

    @triton.jit
    def pdl_wait(USE_PDL: tl.constexpr):
        """Wait for the previous kernel (rule one). Work that reads only constants (weights) may
        come before this call."""
        if USE_PDL:
            gdc_wait()

    @triton.jit
    def pdl_release(USE_PDL: tl.constexpr):
        """Let the next kernel be placed (rule two): call it when the main work is done."""
        if USE_PDL:
            gdc_launch_dependents()
