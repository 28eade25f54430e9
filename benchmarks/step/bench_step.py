"""Stage 0 decode step time by batch size and context length, per graph path, beside the
memory-bandwidth floor measured in the same run.

Drives the real `ModelRunner` with real `StepPlan`s (no scheduler, no HTTP): for each graph
path (eager, MLP graphs, full decode graph) one runner is built; for each context L, B_max
requests are added and prefilled to L tokens with prefill plans (chunks packed up to
max_num_batched_tokens), then for each batch B the first B requests run `--iters` timed decode
steps. The decode position is held at L, so every timed step reads exactly L + 1 cached tokens
per request (the K/V written at position L is overwritten each step): the context does not
drift while one prefill serves every batch size. `min_frames` is huge, so nothing stops.

Step time = wall time of `runner.execute(plan)`, which ends with the step's one device→host copy
and a stream synchronize: host staging, the H2D copy, the GPU work and the D2H copy are all in
it, as in serving. For the full decode graph the GPU-only time (CUDA events around the graph
replay alone, back to back) is reported too.

Floor of a step = bytes that must be read from HBM / copy bandwidth, where bytes = all backbone
weights + the audio table (the fused audio embedding = tied audio head, read in full by the head
matmul; the text embedding is only gathered, never read whole) + the K/V of L tokens × B in the
cache's dtype (`--kv-cache-dtype fp8`: 1 byte per element, half of bf16's), and the bandwidth is a
device-to-device copy of >= 2 GiB measured here: (bytes read + written) / s. Each runner's peak
`torch.cuda.max_memory_allocated` (weights included) goes in the JSON.

Usage (GPU):
  higgs-serve make-tiny-model /tmp/h4b --preset 4b --config-only
  PYTHONPATH=src python3 benchmarks/step/bench_step.py --model /tmp/h4b --out step.json
  ... --paths full_graph --batch 64 --context 4096 --kv-cache-dtype fp8 --out step_fp8.json
CPU smoke run: --device cpu --paths eager --batch 1 2 --context 16 --iters 2 (tiny model).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from common import (command_line, device_description, git_commit, markdown_table, now_iso,  # noqa: E402
                    percentile, write_json)

from higgs_serve.engine.builder import LoadedModel, RuntimeOptions, load_model  # noqa: E402
from higgs_serve.worker.step_contract import NewRequestData, ScheduledChunk, StepPlan  # noqa: E402
from higgs_serve.kernels import pdl  # noqa: E402
from higgs_serve.model.fused_ops import CublasOps, TritonOps  # noqa: E402
from higgs_serve.sampling_params import SamplingParams  # noqa: E402
from higgs_serve.worker.attention.kv_cache_dtype import kv_bytes_per_token, resolve_kv_cache_dtype  # noqa: E402
from higgs_serve.worker.attention.selector import get_backend  # noqa: E402
from higgs_serve.worker.cuda_graphs import CudaGraphDispatcher, CudaGraphMode  # noqa: E402
from higgs_serve.worker.model_runner import KVCacheSpec, ModelRunner  # noqa: E402

logger = logging.getLogger("bench_step")

PATHS = ("eager", "mlp_graphs", "full_graph", "piecewise")
_EXPECTED_MODE = {"eager": CudaGraphMode.NONE, "mlp_graphs": CudaGraphMode.LOCAL_MLP, "full_graph": CudaGraphMode.FULL,
                  "piecewise": CudaGraphMode.PIECEWISE}
_PATH_OF_MODE = {mode: path for path, mode in _EXPECTED_MODE.items()}  # the results' names of the step modes
GEMM_OPS = {"skinny": TritonOps, "cublas": CublasOps}
PDL_MODES = {"on": True, "off": False}  # programmatic dependent launch (kernels/pdl.py)
TAPE_MODES = {"on": True, "off": False}  # launch tapes of eager decode steps (worker/eager_tapes.py)
PIECEWISE_TOKENS = (96, 128, 192, 256, 384, 512)  # the deploy config's default token counts
_NEVER = 1 << 30  # frames: min/max frame counts no timed run reaches


# ------------------------------------------------------------------------------ bandwidth floor
def measure_copy_bandwidth(device: torch.device, nbytes: int, repeats: int = 10) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read + bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    src.fill_(1)
    dst = torch.empty_like(src)
    for _ in range(2):  # warm-up (first-touch, clocks)
        dst.copy_(src)
    _sync(device)
    t0 = time.perf_counter()
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            dst.copy_(src)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3
    else:
        for _ in range(repeats):
            dst.copy_(src)
        seconds = time.perf_counter() - t0
    del src, dst
    return 2 * nbytes * repeats / seconds


def step_weight_bytes(loaded: LoadedModel) -> int:
    """Weight bytes one decode step must read: every backbone tensor, plus the audio table (the
    head matmul reads all of W_a; an untied head too). The text embedding is only gathered."""
    talker = loaded.talker
    tensors = list(talker.backbone.parameters()) + [talker.audio_embedding]
    if talker.audio_head is not None:
        tensors.append(talker.audio_head)
    return sum(t.numel() * t.element_size() for t in tensors)


# ------------------------------------------------------------------------------ runner + plans
@dataclass(frozen=True)
class BenchShape:
    batches: tuple[int, ...]  # ascending
    contexts: tuple[int, ...]  # ascending
    block_size: int
    max_num_batched_tokens: int
    max_model_len: int

    mixed_tokens: int = 0  # prompt tokens of the one prefill chunk in a timed mixed step
    kv_cache_dtype: torch.dtype | None = None  # None: the model dtype

    @property
    def max_batch(self) -> int:
        return self.batches[-1]

    @property
    def num_slots(self) -> int:
        """The decode slots, plus one for the mixed steps' prefill request."""
        return self.max_batch + (1 if self.mixed_tokens else 0)

    def blocks_per_request(self) -> int:
        return -(-(max(self.contexts[-1] + 1, self.mixed_tokens)) // self.block_size)


def graph_policy_for(path: str, batches: tuple[int, ...], device: torch.device, max_tokens: int) -> CudaGraphDispatcher:
    if path == "eager":
        return CudaGraphDispatcher()
    if device.type != "cuda":
        raise SystemExit(f"bench_step: --paths {path} needs CUDA (graphs are captured on a GPU); use --paths eager on CPU")
    if path == "mlp_graphs":
        return CudaGraphDispatcher(CudaGraphMode.LOCAL_MLP, decode_sizes=batches)
    if path == "full_graph":
        return CudaGraphDispatcher(CudaGraphMode.FULL_DECODE_ONLY, decode_sizes=batches)
    if path == "piecewise":
        tokens = tuple(t for t in PIECEWISE_TOKENS if batches[-1] < t <= max_tokens)
        return CudaGraphDispatcher(CudaGraphMode.PIECEWISE, piecewise_sizes=batches + tokens)
    raise SystemExit(f"bench_step: unknown path {path!r}; expected one of {PATHS}")


def build_runner(loaded: LoadedModel, policy: CudaGraphDispatcher, shape: BenchShape,
                 launch_tapes: bool = True) -> ModelRunner:
    """A runner whose KV pool holds max batch × (max context + 1) tokens."""
    backend = get_backend("triton" if loaded.device.type == "cuda" else "torch")
    kv = KVCacheSpec(num_blocks=shape.num_slots * shape.blocks_per_request(), block_size=shape.block_size,
                     dtype=shape.kv_cache_dtype)
    return ModelRunner(
        talker=loaded.talker, backend=backend, kv=kv, max_num_seqs=shape.num_slots,
        max_num_batched_tokens=shape.max_num_batched_tokens, max_model_len=shape.max_model_len,
        device=loaded.device, dtype=loaded.dtype, graphs=policy, launch_tapes=launch_tapes,
    )


class PlanMaker:
    """Builds the StepPlans of the benchmark: slot i owns blocks [i*n, (i+1)*n) for good."""

    def __init__(self, shape: BenchShape, vocab_size: int):
        self.shape = shape
        self.vocab_size = vocab_size
        self.step_id = 0
        self.generation = 0  # request ids change per context, so no id is reused
        per = shape.blocks_per_request()
        self.blocks = [tuple(range(i * per, (i + 1) * per)) for i in range(shape.num_slots)]

    def _next_id(self) -> int:
        self.step_id += 1
        return self.step_id

    def request_id(self, slot: int) -> str:
        return f"g{self.generation}-s{slot}"

    def block_ids(self, slot: int, num_tokens: int) -> tuple[int, ...]:
        return self.blocks[slot][: -(-num_tokens // self.shape.block_size)]

    def prefill_plans(self, context: int, released: tuple[int, ...]) -> list[StepPlan]:
        """New requests in every slot with a `context`-token prompt, prefilled in chunks packed
        up to max_num_batched_tokens per plan; the last chunk of each samples its first row."""
        self.generation += 1
        rng = np.random.default_rng(context)
        new = [self._new_request(slot, rng, context) for slot in range(self.shape.max_batch)]
        if self.shape.mixed_tokens:  # the mixed steps' request: prefilled by those steps themselves
            new.append(self._new_request(self.shape.max_batch, rng, self.shape.mixed_tokens))
        budget = self.shape.max_num_batched_tokens
        plans: list[StepPlan] = []
        chunks: list[ScheduledChunk] = []
        used = 0

        def flush() -> None:
            nonlocal chunks, used
            first = not plans
            plans.append(StepPlan(step_id=self._next_id(), new_requests=tuple(new) if first else (),
                                  chunks=tuple(chunks), released_slots=released if first else ()))
            chunks, used = [], 0

        for slot in range(self.shape.max_batch):
            start = 0
            while start < context:
                if used == budget or len(chunks) == self.shape.max_batch:
                    flush()
                count = min(context - start, budget - used)
                end = start + count
                chunks.append(ScheduledChunk(self.request_id(slot), slot, start, count,
                                             self.block_ids(slot, end), samples=end == context))
                used += count
                start = end
        flush()
        return plans

    def _new_request(self, slot: int, rng: np.random.Generator, length: int) -> NewRequestData:
        prompt = tuple(int(t) for t in rng.integers(0, self.vocab_size, size=length))
        sampling = SamplingParams(seed=1000 + slot, max_new_tokens=_NEVER, min_new_tokens=_NEVER)
        return NewRequestData(request_id=self.request_id(slot), slot=slot, prompt_token_ids=prompt,
                              placeholder_rows=None, placeholder_start=0, sampling=sampling,
                              max_frames=_NEVER, min_frames=_NEVER)

    def mixed_plan(self, batch: int, context: int) -> StepPlan:
        """`batch` decodes (as in decode_plan) plus the whole `mixed_tokens` prompt of the extra
        slot as one prefill chunk (re-run each time: same positions, same pages)."""
        slot, count = self.shape.max_batch, self.shape.mixed_tokens
        prefill = ScheduledChunk(self.request_id(slot), slot, 0, count, self.block_ids(slot, count), samples=True)
        decode = self.decode_plan(batch, context)
        return StepPlan(step_id=decode.step_id, new_requests=(), chunks=decode.chunks + (prefill,), released_slots=())

    def decode_plan(self, batch: int, context: int) -> StepPlan:
        """One decode step for slots 0..batch-1, each at position `context` (reads context + 1)."""
        chunks = tuple(ScheduledChunk(self.request_id(slot), slot, context, 1,
                                      self.block_ids(slot, context + 1), samples=True)
                       for slot in range(batch))
        return StepPlan(step_id=self._next_id(), new_requests=(), chunks=chunks, released_slots=())


# ------------------------------------------------------------------------------ timing
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(runner: ModelRunner, make_plan, batch: int, context: int, iters: int,
               warmup: int) -> list[float]:
    """Wall seconds of `iters` steps of `make_plan(batch, context)` (after `warmup` untimed ones)."""
    for _ in range(warmup):
        runner.execute(make_plan(batch, context))
    _sync(runner.device)
    times = []
    for _ in range(iters):
        plan = make_plan(batch, context)
        t0 = time.perf_counter()
        result = runner.execute(plan)  # ends with the D2H copy + stream synchronize
        times.append(time.perf_counter() - t0)
        if len(result.rows) != len(plan.chunks) or result.finished:
            raise RuntimeError(f"decode step at batch {batch}, context {context} returned "
                               f"{len(result.rows)} rows, finished={result.finished}")
    return times


def time_graph_replay(runner: ModelRunner, batch: int, iters: int) -> float | None:
    """GPU-only seconds of one full-decode-graph replay (the inputs of the last real step stay
    staged; replays run back to back between two CUDA events). None off the full graph path."""
    graphs = getattr(runner, "_full_graphs", None)  # runner internals: a benchmark-only peek
    if graphs is None or runner.device.type != "cuda":
        return None
    _, padded = runner.graphs.dispatch(batch, True)
    graph = graphs.graphs[padded]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def time_one(runner: ModelRunner, path: str, kind: str, make_plan, batch: int, context: int, args,
             floor_of) -> dict:
    """One row: `kind` steps ("decode": B decodes; "mixed": B decodes + one prefill chunk)."""
    modes_before = dict(runner.step_modes)
    times = time_steps(runner, make_plan, batch, context, args.iters, args.warmup)
    used = {_PATH_OF_MODE[m] for m in runner.step_modes if runner.step_modes[m] > modes_before[m]}
    gpu_s = time_graph_replay(runner, batch, args.iters) if path == "full_graph" and kind == "decode" else None
    med = percentile(times, 50)
    floor = floor_of(batch, context)
    logger.info("%s %s B=%d L=%d: %.2f ms (floor %.2f ms) as %s", path, kind, batch, context, med * 1e3,
                floor * 1e3, sorted(used))
    return {
        "path": path, "step": kind, "batch": batch, "context": context,
        "step_ms_median": med * 1e3, "step_ms_p90": percentile(times, 90) * 1e3,
        "step_ms_min": min(times) * 1e3,
        "gpu_ms": None if gpu_s is None else gpu_s * 1e3,
        "floor_ms": floor * 1e3, "ratio": med / floor,
        "frames_per_s": batch / med, "modes": sorted(used), "iters": len(times),
    }


def run_path(loaded: LoadedModel, path: str, gemm: str, pdl_mode: str, tapes: str, shape: BenchShape, args,
             floor_of) -> tuple[list[dict], dict]:
    """All (context, batch) rows of one graph path with one GEMM implementation, PDL mode and
    launch-tape mode, on a fresh runner (its graphs are captured with that mode)."""
    if loaded.device.type == "cuda":
        loaded.talker.backbone.set_ops(GEMM_OPS[gemm])
        pdl.set_enabled(PDL_MODES[pdl_mode])
    policy = graph_policy_for(path, shape.batches, loaded.device, shape.max_num_batched_tokens)
    if loaded.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(loaded.device)  # this runner's peak (weights stay allocated)
    t0 = time.perf_counter()
    runner = build_runner(loaded, policy, shape, TAPE_MODES[tapes])
    capture = runner.capture_graphs()
    info = {"path": path, "gemm": gemm, "pdl": pdl_mode, "pdl_active": pdl.enabled(loaded.device), "tapes": tapes,
            "capture_sizes": list(policy.decode_sizes or policy.piecewise_sizes), "build_and_capture_s": time.perf_counter() - t0,
            "capture": capture, "kv_blocks": runner.kv.num_blocks, "kv_cache_dtype": str(runner.kv_cache_dtype),
            "kv_cache_bytes": sum(c.numel() * c.element_size() for pair in runner.kv_caches for c in pair)}
    logger.info("%s: runner built and graphs captured in %.1f s", path, info["build_and_capture_s"])
    plans = PlanMaker(shape, loaded.spec.text.vocab_size)
    rows = []
    released: tuple[int, ...] = ()
    prefill_s = 0.0
    for context in shape.contexts:
        t1 = time.perf_counter()
        for plan in plans.prefill_plans(context, released):
            runner.execute(plan)
        _sync(loaded.device)
        prefill_s += time.perf_counter() - t1
        released = tuple(range(shape.max_batch))
        kinds = [("decode", plans.decode_plan)] + ([("mixed", plans.mixed_plan)] if shape.mixed_tokens else [])
        for kind, make_plan in kinds:
            for batch in shape.batches:
                rows.append({**time_one(runner, path, kind, make_plan, batch, context, args, floor_of),
                             "gemm": gemm, "pdl": pdl_mode, "tapes": tapes})
    info["prefill_s"] = prefill_s
    info["step_modes"] = {_PATH_OF_MODE[m]: n for m, n in runner.step_modes.items()}
    info["tape_replays"] = runner.tapes.replays if runner.tapes is not None else 0
    info["max_memory_allocated_bytes"] = (torch.cuda.max_memory_allocated(loaded.device)
                                          if loaded.device.type == "cuda" else None)
    del runner, plans
    gc.collect()
    if loaded.device.type == "cuda":
        torch.cuda.empty_cache()
    return rows, info


# ------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="model dir (a 4B config from `make-tiny-model --preset 4b --config-only`)")
    p.add_argument("--load-format", choices=["auto", "dummy"], default="dummy")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--paths", nargs="+", choices=PATHS, default=None, help="default: all three on CUDA, eager on CPU")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--context", type=int, nargs="+", default=[128, 1024, 4096])
    p.add_argument("--iters", type=int, default=50, help="timed decode steps per (path, batch, context)")
    p.add_argument("--warmup", type=int, default=3, help="untimed decode steps before each timed run")
    p.add_argument("--gemm", nargs="+", choices=sorted(GEMM_OPS), default=["skinny"],
                   help="decode GEMMs: the skinny Triton kernel (the engine's default) or cuBLAS; several run side by side")
    p.add_argument("--pdl", nargs="+", choices=list(PDL_MODES), default=["on"],
                   help="programmatic dependent launch between the Triton kernels (on: the engine's default on "
                        "Hopper); both values run side by side")
    p.add_argument("--tapes", nargs="+", choices=list(TAPE_MODES), default=["on"],
                   help="launch tapes for eager decode steps (on: the engine's default); both values run side by side")
    p.add_argument("--mixed-tokens", type=int, default=0,
                   help="also time mixed steps: each batch's decodes plus one prefill chunk of this many tokens")
    p.add_argument("--kv-cache-dtype", choices=["auto", "fp8"], default="auto",
                   help="KV storage: auto (the model dtype) or fp8 (e4m3, scale 1.0), as Stage 0's kv_cache_dtype")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, default=4096, help="prefill chunk budget per step")
    p.add_argument("--max-model-len", type=int, default=8192,
                   help="the runner's max_model_len (the profiles' value; the full graph bakes it in as its bound)")
    p.add_argument("--copy-gib", type=float, default=None, help="size of the bandwidth copy (default 2 on CUDA, 0.25 on CPU)")
    p.add_argument("--out", default=None, help="write the JSON here")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    if args.iters < 1 or args.warmup < 0:
        p.error("--iters must be >= 1 and --warmup >= 0")
    if min(args.batch) < 1 or min(args.context) < 1:
        p.error("--batch and --context values must be >= 1")
    if torch.device(args.device).type != "cuda" and (args.gemm != ["skinny"] or args.pdl != ["on"]):
        p.error("--gemm and --pdl choose between CUDA kernels; on CPU the reference ops run (leave them out)")
    if max(args.context) + 1 > args.max_model_len:
        p.error(f"--context {max(args.context)} needs --max-model-len > {max(args.context)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    started = now_iso()
    device = torch.device(args.device)
    paths = args.paths or (list(PATHS) if device.type == "cuda" else ["eager"])
    t0 = time.perf_counter()
    loaded = load_model(args.model, RuntimeOptions(load_format=args.load_format, device=args.device, dtype=args.dtype))
    load_s = time.perf_counter() - t0
    cache_dtype = resolve_kv_cache_dtype(args.kv_cache_dtype, loaded.dtype)
    shape = BenchShape(batches=tuple(sorted(set(args.batch))), contexts=tuple(sorted(set(args.context))),
                       block_size=args.block_size, max_num_batched_tokens=args.max_num_batched_tokens,
                       max_model_len=args.max_model_len, mixed_tokens=args.mixed_tokens, kv_cache_dtype=cache_dtype)
    if shape.max_batch + shape.mixed_tokens > args.max_num_batched_tokens:
        raise SystemExit("bench_step: the largest --batch (+ --mixed-tokens) exceeds --max-num-batched-tokens")
    copy_gib = args.copy_gib if args.copy_gib is not None else (2.0 if device.type == "cuda" else 0.25)
    bandwidth = measure_copy_bandwidth(device, int(copy_gib * (1 << 30)))
    weight_bytes = step_weight_bytes(loaded)
    kv_per_token = kv_bytes_per_token(loaded.spec.text, cache_dtype)  # in the cache's dtype: fp8 halves bf16's

    def floor_of(batch: int, context: int) -> float:
        return (weight_bytes + kv_per_token * context * batch) / bandwidth

    logger.info("copy bandwidth %.0f GB/s; %.2f GB weights read per step; floor at B=1 L=%d: %.3f ms",
                bandwidth / 1e9, weight_bytes / 1e9, shape.contexts[0], floor_of(1, shape.contexts[0]) * 1e3)
    rows: list[dict] = []
    runners: list[dict] = []
    result = {
        "tool": "bench_step",
        "command": command_line(),
        "git_commit": git_commit(),
        "device": {**device_description(), "torch": torch.__version__, "torch_device": str(device),
                   "cuda_name": torch.cuda.get_device_name(device) if device.type == "cuda" else None},
        "started_at": started,
        "finished_at": None,
        "model": args.model, "load_format": args.load_format, "dtype": str(loaded.dtype), "load_s": load_s,
        "copy_bandwidth_gbps": bandwidth / 1e9, "copy_bytes": int(copy_gib * (1 << 30)),
        "weight_bytes_per_step": weight_bytes, "kv_bytes_per_token": kv_per_token,
        "kv_cache_dtype": args.kv_cache_dtype, "kv_cache_torch_dtype": str(cache_dtype),
        "max_memory_allocated_bytes": None,  # the largest runner peak (CUDA), filled in per path
        "settings": {"batches": list(shape.batches), "contexts": list(shape.contexts), "iters": args.iters,
                     "warmup": args.warmup, "block_size": shape.block_size, "mixed_tokens": shape.mixed_tokens,
                     "max_num_batched_tokens": shape.max_num_batched_tokens, "max_model_len": shape.max_model_len},
        "runners": runners,
        "rows": rows,
    }
    for path, gemm, pdl_mode, tapes in itertools.product(paths, args.gemm, args.pdl, args.tapes):
        path_rows, info = run_path(loaded, path, gemm, pdl_mode, tapes, shape, args, floor_of)
        rows += path_rows
        runners.append(info)
        if info["max_memory_allocated_bytes"] is not None:
            result["max_memory_allocated_bytes"] = max(result["max_memory_allocated_bytes"] or 0,
                                                       info["max_memory_allocated_bytes"])
        result["finished_at"] = now_iso()
        if args.out:  # after every path, so a run cut short still leaves its numbers
            write_json(args.out, result)
    peak = result["max_memory_allocated_bytes"]
    print(f"\nStage 0 decode step ({result['device']['cuda_name'] or device}, copy bandwidth "
          f"{bandwidth / 1e9:.0f} GB/s, {weight_bytes / 1e9:.2f} GB weights/step, KV {cache_dtype} "
          f"{kv_per_token} B/token" + (f", peak allocated {peak / 1e9:.2f} GB" if peak else "") + ")\n")
    print(markdown_table(rows, [("path", "path"), ("gemm", "GEMM"), ("pdl", "PDL"), ("tapes", "tapes"), ("step", "step"), ("batch", "B"), ("context", "L"), ("step_ms_median", "step ms p50"),
                                ("step_ms_p90", "p90"), ("gpu_ms", "GPU-only ms"), ("floor_ms", "floor ms"),
                                ("ratio", "p50/floor"), ("frames_per_s", "frames/s")]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
