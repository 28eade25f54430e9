"""Quick Stage 0 decode-step check on the GPU, with an optional torch.profiler kernel table.

Builds one ModelRunner per graph path at the 4B geometry (random weights), prefills B requests
of 128 tokens, times decode steps with `runner.execute`, and with `--profile` prints the CUDA
kernel table of 3 steps. bench_step.py is the full sweep; this is the fast look used to find
where a step's time goes.

  PYTHONPATH=src python3 benchmarks/step/profile_step.py [--paths eager mlp full] [--batch 1 64] [--profile]
      [--host-profile 40]
"""

from __future__ import annotations

import argparse
import cProfile
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from common import profile_listing  # noqa: E402

from higgs_serve.engine.builder import RuntimeOptions, load_model  # noqa: E402
from higgs_serve.worker.step_contract import NewRequestData, ScheduledChunk, StepPlan  # noqa: E402
from higgs_serve.model.tiny import write_tiny_model  # noqa: E402
from higgs_serve.sampling_params import SamplingParams  # noqa: E402
from higgs_serve.worker.attention.selector import get_backend  # noqa: E402
from higgs_serve.worker.cuda_graphs import CudaGraphDispatcher, CudaGraphMode  # noqa: E402
from higgs_serve.worker.model_runner import KVCacheSpec, ModelRunner  # noqa: E402

BLOCK = 16
SIZES = (1, 2, 4, 8, 16, 32, 64)
POLICIES = {"eager": CudaGraphDispatcher(), "mlp": CudaGraphDispatcher(CudaGraphMode.LOCAL_MLP, decode_sizes=SIZES),
            "full": CudaGraphDispatcher(CudaGraphMode.FULL_DECODE_ONLY, decode_sizes=SIZES)}


def _decode(chunks, pos: int, step_id: int) -> StepPlan:
    return StepPlan(step_id, (), tuple(ScheduledChunk(c.request_id, c.slot, pos, 1, c.block_ids, True) for c in chunks), ())


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def host_profile(runner: ModelRunner, chunks, pos: int, steps: int, top: int) -> str:
    """cProfile of `steps` decode steps (this thread only: no codec, no engine loop)."""
    prof = cProfile.Profile()
    prof.enable()
    for s in range(steps):
        runner.execute(_decode(chunks, pos + s, 2000 + s))
    prof.disable()
    return profile_listing(prof, top)


def time_prefills(runner: ModelRunner, device: torch.device, batch: int, count: int, tokens: int, first_block: int, host_top: int) -> None:
    """Time `count` prefill steps of one new `tokens`-token request each, beside the `batch`
    decoding ones' slots (each released by the next step): the eager prefill of a low-latency
    TTFA. Prints the p50 of the step's host time (launch) and of its whole time (launch + wait)."""
    sampling = SamplingParams(temperature=0.8, seed=1, max_new_tokens=64, min_new_tokens=1)
    blocks = tuple(range(first_block, first_block + tokens // BLOCK + 1))
    prof = cProfile.Profile() if host_top else None
    launch_ms, total_ms, released = [], [], ()
    for i in range(count + 2):  # the first two untimed: the first call of a new token count
        slot, rid = batch + i % 2, f"p{i}"
        new = NewRequestData(rid, slot, tuple(range(10, 10 + tokens)), None, 0, sampling, 64, 1)
        plan = StepPlan(5000 + i, (new,), (ScheduledChunk(rid, slot, 0, tokens, blocks, True),), released)
        sync(device)
        if prof is not None and i >= 2:
            prof.enable()
        t0 = time.perf_counter()
        pending = runner.launch(plan)
        t1 = time.perf_counter()
        runner.collect(pending)
        t2 = time.perf_counter()
        if prof is not None:
            prof.disable()
        if i >= 2:
            launch_ms.append(1e3 * (t1 - t0))
            total_ms.append(1e3 * (t2 - t0))
        released = (slot,)
    print(f"prefill {tokens} tokens: launch p50 {statistics.median(launch_ms):.2f} ms, "
          f"launch + wait p50 {statistics.median(total_ms):.2f} ms", flush=True)
    if prof is not None:
        print(profile_listing(prof, host_top, cumulative=False), flush=True)


def run(loaded, policy: CudaGraphDispatcher, batch: int, steps: int, profile: bool, ctx: int = 128,
        host_top: int = 0, prefills: int = 0, prefill_tokens: int = 64) -> float:
    blocks_per = (ctx + steps + 64) // BLOCK + 1
    spare = prefill_tokens // BLOCK + 1
    # two slots past the decoding batch of up to 64: the --prefills requests
    runner = ModelRunner(loaded.talker, get_backend("triton" if loaded.device.type == "cuda" else "torch"), KVCacheSpec(batch * blocks_per + spare + 2, BLOCK),
                         max_num_seqs=64 + 2, max_num_batched_tokens=8192, max_model_len=8192,
                         device=loaded.device, dtype=loaded.dtype, graphs=policy)
    runner.capture_graphs()
    sampling = SamplingParams(temperature=0.8, seed=1, max_new_tokens=2048, min_new_tokens=2000)
    news, chunks = [], []
    for b in range(batch):
        blocks = tuple(range(1 + b * blocks_per, 1 + (b + 1) * blocks_per))
        news.append(NewRequestData(f"r{b}", b, tuple(range(10, 10 + ctx)), None, 0, sampling, 2048, 2000))
        chunks.append(ScheduledChunk(f"r{b}", b, 0, ctx, blocks, True))
    runner.execute(StepPlan(0, tuple(news), tuple(chunks), ()))
    times = []
    for s in range(steps):
        sync(loaded.device)
        t0 = time.perf_counter()
        runner.execute(_decode(chunks, ctx + s, s + 1))
        times.append(time.perf_counter() - t0)
    if profile:
        from torch.profiler import ProfilerActivity
        with torch.profiler.profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            for s in range(3):
                runner.execute(_decode(chunks, ctx + steps + s, 1000 + s))
            sync(loaded.device)
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=60), flush=True)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60), flush=True)
    if host_top:
        print(host_profile(runner, chunks, ctx + steps + 3, 20, host_top), flush=True)
    if prefills:
        time_prefills(runner, loaded.device, batch, prefills, prefill_tokens, 1 + batch * blocks_per, host_top)
    del runner
    if loaded.device.type == "cuda":
        torch.cuda.empty_cache()
    return statistics.median(times[10:]) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--paths", nargs="+", choices=sorted(POLICIES), default=["eager", "mlp", "full"])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--profile", action="store_true", help="torch.profiler tables (GPU kernels, host ops) of 3 steps")
    ap.add_argument("--host-profile", type=int, default=0, metavar="TOP",
                    help="cProfile of 20 steps: the TOP functions by own and by cumulative time")
    ap.add_argument("--prefills", type=int, default=0, help="also time this many eager prefill steps")
    ap.add_argument("--prefill-tokens", type=int, default=64)
    ap.add_argument("--preset", choices=["4b", "tiny"], default="4b")
    ap.add_argument("--device", default="cuda", help="cpu: a quick check of this script (eager path only)")
    args = ap.parse_args()
    if args.device != "cuda" and set(args.paths) != {"eager"}:
        ap.error(f"--device {args.device} runs the eager path only (graphs need CUDA): add --paths eager")
    model_dir = tempfile.mkdtemp()
    write_tiny_model(model_dir, preset=args.preset, config_only=True)
    loaded = load_model(model_dir, RuntimeOptions(load_format="dummy", device=args.device,
                                                  dtype="bfloat16" if args.device == "cuda" else "float32"))
    for path in args.paths:
        for batch in args.batch:
            ms = run(loaded, POLICIES[path], batch, args.steps, args.profile, host_top=args.host_profile,
                     prefills=args.prefills, prefill_tokens=args.prefill_tokens)
            print(f"{path:6s} B={batch:3d} step {ms:7.2f} ms", flush=True)


if __name__ == "__main__":
    main()
