"""Probe: does torch abort when a MemPool dies while another pool routes allocations?

Pool a gets tensors; then, while allocations route into pool b, the case frees a's tensors and a
(in either order), or makes a CUDA graph. On the H200 (torch 2.11) both freeing orders abort the
process in the caching allocator (`captures_underway.empty()`), which is why launch-tape pools
are never destroyed (worker/eager_tapes.py); results in benchmarks/results/mempool_abort_h200.txt.
One case per process, since the failure is an abort:

  python3 benchmarks/probes/probe_mempool_abort.py tensors_first_in_b | pool_first_in_b | graph_in_b
"""

import sys

import torch

CASES = ("tensors_first_in_b", "pool_first_in_b", "graph_in_b")
case = sys.argv[1] if len(sys.argv) == 2 else None
if case not in CASES:
    sys.exit(f"usage: probe_mempool_abort.py {{{'|'.join(CASES)}}}")
a = torch.cuda.MemPool()
with torch.cuda.use_mem_pool(a):
    xs = [torch.empty(1 << 20, device="cuda") for _ in range(4)]
b = torch.cuda.MemPool()
with torch.cuda.use_mem_pool(b):
    y = torch.empty(1 << 20, device="cuda")
    if case == "pool_first_in_b":
        del a
        del xs
    elif case == "tensors_first_in_b":
        del xs
        del a
    elif case == "graph_in_b":
        g = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    z2 = torch.empty(1 << 22, device="cuda")
print(case, "ok", flush=True)
