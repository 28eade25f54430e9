"""Host cost per call of the eager decode path's pieces on CUDA (4B widths, one row): a plain
Triton launch, the same launch through kernels/launcher.py's cache, our op wrappers around it
(allocation, shape handling, launch), torch ops, and a launch through the kernel's compiled handle
(the floor the cached launcher approaches), and the same ops replayed from a launch tape. The loop is host-bound (each kernel's GPU time is a few microseconds), so time per
call is host time; "incl. drain" adds the final synchronize.

  PYTHONPATH=src python3 benchmarks/step/bench_launch.py
"""
import time

import torch

from higgs_serve.kernels import launch_tape, pdl
from higgs_serve.model.fused_ops import TritonOps, _rms_norm_kernel
from higgs_serve.kernels.launcher import Launcher


def bench(name, fn, n=3000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t) / n
    torch.cuda.synchronize()
    tot = (time.perf_counter() - t) / n
    print(f"{name:40s} host {host*1e6:7.2f} us/call   (incl. drain {tot*1e6:7.2f})")


def main() -> None:
    dev = torch.device("cuda")
    D, I = 2560, 9728
    x = torch.randn(1, D, device=dev, dtype=torch.bfloat16)
    w = torch.randn(D, device=dev, dtype=torch.bfloat16)
    wq = torch.randn(6144, D, device=dev, dtype=torch.bfloat16)
    wo = torch.randn(D, 4096, device=dev, dtype=torch.bfloat16)
    gu = torch.randn(1, 2 * I, device=dev, dtype=torch.bfloat16)
    ao = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)
    cos = torch.randn(1, 1, 128, device=dev, dtype=torch.bfloat16)
    qkv = torch.randn(1, 6144, device=dev, dtype=torch.bfloat16)
    qw = torch.randn(128, device=dev, dtype=torch.bfloat16)
    out = torch.empty_like(x)
    la = pdl.launch_args(dev)
    bench("torch.empty_like", lambda: torch.empty_like(x))
    bench("pdl.launch_args", lambda: pdl.launch_args(dev))
    bench("raw _rms_norm_kernel[grid]", lambda: _rms_norm_kernel[(1,)](x, w, out, x.stride(0), out.stride(0), 1e-6, D=D, BLOCK=4096, num_warps=4, **la))
    cached = Launcher(_rms_norm_kernel)
    bench("Launcher(_rms_norm_kernel)(grid, ...)", lambda: cached((1,), x, w, out, x.stride(0), out.stride(0), 1e-6, D=D, BLOCK=4096, num_warps=4, **la))
    bench("TritonOps.rms_norm", lambda: TritonOps.rms_norm(x, w, 1e-6))
    bench("TritonOps.linear qkv (skinny)", lambda: TritonOps.linear(x, wq))
    bench("TritonOps.linear_residual o (split)", lambda: TritonOps.linear_residual(ao, wo, x))
    bench("TritonOps.silu_mul", lambda: TritonOps.silu_mul(gu))
    bench("TritonOps.qk_norm_rope", lambda: TritonOps.qk_norm_rope(qkv, qw, qw, 1e-6, cos, cos, 32, 8, 128))
    bench("torch add", lambda: x + x)
    bench("F.linear cublas", lambda: torch.nn.functional.linear(x, wq))
    # compiled-handle launch: what a launcher that skips Triton's per-call binding would cost
    ck = _rms_norm_kernel[(1,)](x, w, out, x.stride(0), out.stride(0), 1e-6, D=D, BLOCK=4096, num_warps=4, **la)
    print("compiled type", type(ck).__name__, "arg names", _rms_norm_kernel.arg_names)
    full = [x, w, out, x.stride(0), out.stride(0), 1e-6, D, 4096, la["USE_PDL"]]
    out2 = torch.empty_like(x)
    full2 = [x, w, out2, x.stride(0), out2.stride(0), 1e-6, D, 4096, la["USE_PDL"]]
    ck[(1, 1, 1)](*full2)
    torch.cuda.synchronize()
    print("compiled launch equal:", torch.equal(out, out2))
    runner = ck[(1, 1, 1)]
    bench("compiled[grid](*args)", lambda: ck[(1, 1, 1)](*full))
    bench("prebuilt runner(*args)", lambda: runner(*full))
    s = torch.cuda.current_stream().cuda_stream
    bench("prebuilt runner(*args, stream=)", lambda: runner(*full, stream=s))
    # the high-throughput profile's per-layer MLP graph against the same ops launched eagerly,
    # and a one-kernel graph (what a replay itself costs on the host)
    wgu = torch.randn(2 * I, D, device=dev, dtype=torch.bfloat16) * D ** -0.5
    wd = torch.randn(D, I, device=dev, dtype=torch.bfloat16) * I ** -0.5

    def mlp():
        return TritonOps.linear_residual(TritonOps.linear_silu_mul(TritonOps.rms_norm(x, w, 1e-6), wgu), wd, x)

    def norm():
        return TritonOps.rms_norm(x, w, 1e-6)

    graphs = {}
    for name, fn in (("mlp", mlp), ("norm", norm)):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graphs[name] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[name]):
            fn()
    bench("MLP eager (norm, gate_up+SiLU, down)", mlp, n=500)
    bench("MLP graph replay", graphs["mlp"].replay, n=500)
    bench("one-kernel graph replay", graphs["norm"].replay)
    # the same ops from launch tapes (kernels/launch_tape.py): per entry, the C launch and nothing else
    pool = torch.cuda.MemPool()  # the tapes' temporaries stay theirs
    for name, fn in (("rms_norm", norm), ("MLP (norm, gate_up+SiLU, down)", mlp)):
        _, tape = launch_tape.record(lambda h, fn=fn: (fn(),), [x], launch_tape.spans([x, w, wgu, wd]), pool)
        assert tape.void_reason is None, tape.void_reason
        bench(f"{name} from a launch tape ({len(tape.entries)} launches)", tape.replay, n=500)


if __name__ == "__main__":
    main()
