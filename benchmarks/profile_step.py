"""Quick Stage 0 decode-step check on the GPU, with an optional torch.profiler kernel table.

Builds one ModelRunner per graph path at the 4B geometry (random weights), prefills B requests
of 128 tokens, times decode steps with `runner.execute`, and with `--profile` prints the CUDA
kernel table of 3 steps. bench_step.py is the full sweep; this is the fast look used to find
where a step's time goes.

  PYTHONPATH=src python3 benchmarks/profile_step.py [--paths eager mlp full] [--batch 1 64] [--profile]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from higgs_serve.engine.builder import RuntimeOptions, load_model
from higgs_serve.engine.outputs import NewRequestData, ScheduledChunk, StepPlan
from higgs_serve.model.tiny import write_tiny_model
from higgs_serve.sampling_params import SamplingParams
from higgs_serve.worker.attention.backend import get_backend
from higgs_serve.worker.cuda_graphs import GraphPolicy
from higgs_serve.worker.model_runner import KVCacheSpec, ModelRunner

BLOCK = 16
SIZES = (1, 2, 4, 8, 16, 32, 64)
POLICIES = {"eager": GraphPolicy.eager(), "mlp": GraphPolicy(False, True, SIZES), "full": GraphPolicy(True, False, SIZES)}


def _decode(chunks, pos: int, step_id: int) -> StepPlan:
    return StepPlan(step_id, (), tuple(ScheduledChunk(c.request_id, c.slot, pos, 1, c.block_ids, True) for c in chunks), ())


def run(loaded, policy: GraphPolicy, batch: int, steps: int, profile: bool, ctx: int = 128) -> float:
    blocks_per = (ctx + steps + 64) // BLOCK + 1
    runner = ModelRunner(loaded.talker, get_backend("triton"), KVCacheSpec(batch * blocks_per + 2, BLOCK),
                         max_num_seqs=64, max_num_batched_tokens=8192, max_model_len=8192,
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
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        runner.execute(_decode(chunks, ctx + s, s + 1))
        times.append(time.perf_counter() - t0)
    if profile:
        from torch.profiler import ProfilerActivity
        with torch.profiler.profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            for s in range(3):
                runner.execute(_decode(chunks, ctx + steps + s, 1000 + s))
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=60), flush=True)
    del runner
    torch.cuda.empty_cache()
    return statistics.median(times[10:]) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--paths", nargs="+", choices=sorted(POLICIES), default=["eager", "mlp", "full"])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    model_dir = tempfile.mkdtemp()
    write_tiny_model(model_dir, preset="4b", config_only=True)
    loaded = load_model(model_dir, RuntimeOptions(load_format="dummy", device="cuda", dtype="bfloat16"))
    for path in args.paths:
        for batch in args.batch:
            ms = run(loaded, POLICIES[path], batch, args.steps, args.profile)
            print(f"{path:6s} B={batch:3d} step {ms:7.2f} ms", flush=True)


if __name__ == "__main__":
    main()
