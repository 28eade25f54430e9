"""Host work of eager Stage 0 steps, measured without a GPU.

The runner's real eager path runs on CPU (TritonOps, the Triton attention backend's per-step host
code, the launch tapes of worker/eager_tapes.py) with every Triton launch replaced by a counting
no-op, on a model of the 4B talker's depth (36 layers) at small widths. What is timed is therefore
the Python and allocator work around the launches, per step and per layer: the part that launch
tapes and fewer, fused launches remove. The driver's own cost per launch is not in it (on the
H200 host a launch through the C launcher costs several microseconds more:
benchmarks/results/launch_overhead_*_h200.txt). Absolute times are this CPU's; compare the
columns of one run, and take GPU-host times from the GPU benchmarks.

Per (tapes off/on, batch, step kind): host ms of the decoder stack and of the whole step (median),
launches per step (made op by op / issued in all), aten ops per step. Step kinds: a decode of B
requests, and a mixed step (the B decodes and a 32-token prompt chunk: the prefill path of both
profiles; taped up to 128 rows, padded to a multiple of 8, their GEMMs past 64 rows as
row blocks). Plus a cProfile listing of the op-by-op
decode step (host time per op).

  PYTHONPATH=src python3 benchmarks/step/bench_eager_host.py [--layers 36] [--batch 1 16 64] [--steps 200] [--out F]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import logging
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from step.bench_step import BenchShape, PlanMaker  # noqa: E402
from common import markdown_table, now_iso, profile_listing, provenance, write_json  # noqa: E402

from higgs_serve.engine.builder import RuntimeOptions, load_model  # noqa: E402
from higgs_serve.kernels import launch_tape  # noqa: E402
from higgs_serve.kernels import launcher as launcher_module  # noqa: E402
from higgs_serve.model import fused_ops, skinny_gemm  # noqa: E402
from higgs_serve.model.skinny_gemm import MAX_ROWS, SMALL_ROWS, SkinnyConfig, default_config  # noqa: E402
from higgs_serve.model.tiny import write_tiny_model  # noqa: E402
from higgs_serve.worker.attention import triton_backend, triton_paged  # noqa: E402
from higgs_serve.worker.attention.backend import AttentionBackend  # noqa: E402
from higgs_serve.worker.cuda_graphs import CudaGraphDispatcher  # noqa: E402
from higgs_serve.worker.eager_tapes import EagerTapes  # noqa: E402
from higgs_serve.worker.model_runner import KVCacheSpec, ModelRunner  # noqa: E402

# every module-level Triton launcher of the talker's eager path
LAUNCHERS = {fused_ops: ("_rms_norm", "_qk_norm_rope", "_silu_mul"), skinny_gemm: ("_skinny", "_split_reduce"),
             triton_paged: ("_kv_write", "_decode", "_decode_reduce", "_prefill")}
MIXED_TOKENS = 32  # the prompt chunk of a mixed step: with up to 96 decodes the step stays tapeable (<= 128 rows)


class LaunchCounts:
    def __init__(self) -> None:
        self.op_by_op = 0  # launches made through a launcher call
        self.issued = 0  # launches that reached the "device": op by op or from a tape


class FakeLauncher:
    """A cached Triton launch that issues nothing: counts, and goes on the tape being recorded
    exactly as `Launcher` puts a launch there."""

    def __init__(self, counts: LaunchCounts):
        self.counts = counts

    def __call__(self, grid, *args, **meta) -> None:
        self.counts.op_by_op += 1
        self.issue()
        if launch_tape.recording.tape is not None:
            launcher_module._tape(self, self.issue, (), args, ())

    def issue(self, *args) -> None:
        self.counts.issued += 1


def skinny_config_as_4b(m: int, n: int, k: int, num_sms: int) -> SkinnyConfig | None:
    """Every GEMM of up to 64 rows on the skinny kernel, as the 4B talker's four GEMMs are (the
    small widths here have no measured buckets past 16 rows and would go to cuBLAS)."""
    return default_config(min(m, SMALL_ROWS), n, k, num_sms) if m <= MAX_ROWS else None


@contextmanager
def fake_launches(four_b_gemms: bool = False):
    """Every talker launcher replaced by a FakeLauncher (and the SM count the GEMM configs ask
    for fixed at an H200's; with `four_b_gemms`, the GEMM choice of the 4B talker); yields the
    counts. Restores the modules on exit."""
    counts = LaunchCounts()
    saved = [(module, name, getattr(module, name, None)) for module, names in LAUNCHERS.items() for name in names]
    saved += [(fused_ops, "_num_sms", fused_ops._num_sms), (fused_ops, "config_for", fused_ops.config_for)]
    try:
        for module, names in LAUNCHERS.items():
            for name in names:
                setattr(module, name, FakeLauncher(counts))
        fused_ops._num_sms = lambda device: 132
        if four_b_gemms:
            fused_ops.config_for = skinny_config_as_4b
        yield counts
    finally:
        for module, name, value in saved:
            if value is None:
                delattr(module, name)
            else:
                setattr(module, name, value)


class HostTritonBackend(AttentionBackend):
    """The Triton backend's per-step host code, on CPU caches (its kernels are the fakes)."""

    name = "triton-host"

    def bind(self, meta, kv_caches):
        return triton_backend.TritonBoundAttention(meta, kv_caches, num_sms=132)


class AtenCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def deep_model(layers: int):
    """The tiny checkpoint's widths at `layers` layers, random weights, bfloat16 (the skinny GEMM
    path; float32 GEMMs go to cuBLAS)."""
    directory = Path(tempfile.mkdtemp(prefix="eager_host_"))
    write_tiny_model(directory)
    config = json.loads((directory / "config.json").read_text())
    config["text_config"]["num_hidden_layers"] = layers
    (directory / "config.json").write_text(json.dumps(config))
    loaded = load_model(str(directory), RuntimeOptions(load_format="dummy", device="cpu", dtype="bfloat16"))
    loaded.talker.backbone.set_ops(fused_ops.TritonOps)
    return loaded


def build_runner(loaded, shape: BenchShape, tapes: bool) -> ModelRunner:
    kv = KVCacheSpec(num_blocks=shape.num_slots * shape.blocks_per_request(), block_size=shape.block_size)
    runner = ModelRunner(talker=loaded.talker, backend=HostTritonBackend(), kv=kv, max_num_seqs=shape.num_slots,
                         max_num_batched_tokens=shape.max_num_batched_tokens, max_model_len=shape.max_model_len,
                         device=loaded.device, dtype=loaded.dtype, graphs=CudaGraphDispatcher())
    # tapes are CUDA-only by default: here they record the fake launches
    runner.tapes = EagerTapes(loaded.device, runner._persistent_tensors) if tapes else None
    return runner


class Timed:
    """Wraps callables and keeps the seconds of each outermost call (a tape's run may call the
    op-by-op decoder inside it: that counts once)."""

    def __init__(self):
        self.seconds: list[float] = []
        self._depth = 0

    def wrap(self, fn):
        def timed(*args, **kwargs):
            self._depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.seconds.append(time.perf_counter() - t0)
        return timed


@contextmanager
def timed_decoder(runner: ModelRunner):
    """Time the decoder stack of each step: the tape's run (a replay, or the recording) where the
    step goes through the tapes, else the backbone's op-by-op decoder. Other host work of the step
    (staging, embeddings, sampling) is torch compute on this CPU and would not be host work on a GPU."""
    timer = Timed()
    owners = [(runner.talker.backbone, "decoder")] + ([(runner.tapes, "run")] if runner.tapes is not None else [])
    for owner, name in owners:
        setattr(owner, name, timer.wrap(getattr(owner, name)))
    try:
        yield timer
    finally:
        for owner, name in owners:
            delattr(owner, name)  # back to the class's method


def measure(runner: ModelRunner, make_plan, counts: LaunchCounts, steps: int) -> dict:
    """Median host ms of `steps` steps and of their decoder stacks, and launches and aten ops per
    step (counted in a separate step)."""
    with torch.inference_mode(), timed_decoder(runner) as decoder:
        for _ in range(3):  # the first records the tape
            runner.execute(make_plan())
        del decoder.seconds[:]
        times = []
        for _ in range(steps):
            plan = make_plan()
            t0 = time.perf_counter()
            runner.execute(plan)
            times.append(time.perf_counter() - t0)
        before = counts.op_by_op, counts.issued
        with AtenCounter() as aten:
            runner.execute(make_plan())
    return {"step_host_ms": statistics.median(times) * 1e3, "decoder_host_ms": statistics.median(decoder.seconds) * 1e3,
            "launches_op_by_op": counts.op_by_op - before[0], "launches_issued": counts.issued - before[1],
            "aten_ops": aten.count}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=36)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--context", type=int, default=32)
    p.add_argument("--profile-top", type=int, default=25)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)  # the engine's host loop is one thread
    started = now_iso()
    loaded = deep_model(args.layers)
    batches = tuple(sorted(set(args.batch)))
    shape = BenchShape(batches=batches, contexts=(args.context,), block_size=16,
                       max_num_batched_tokens=max(256, batches[-1] + MIXED_TOKENS), max_model_len=args.context + 64,
                       mixed_tokens=MIXED_TOKENS)
    rows, listing = [], ""
    with fake_launches(four_b_gemms=True) as counts:
        for tapes in (False, True):
            runner = build_runner(loaded, shape, tapes)
            plans = PlanMaker(shape, loaded.spec.text.vocab_size)
            with torch.inference_mode():
                for plan in plans.prefill_plans(args.context, ()):
                    runner.execute(plan)
            for batch in batches:
                for kind, make in (("decode", plans.decode_plan), ("mixed", plans.mixed_plan)):
                    row = measure(runner, lambda: make(batch, args.context), counts, args.steps)
                    rows.append({"step": kind, "tapes": "on" if tapes else "off", "batch": batch, **row,
                                 "decoder_host_us_per_layer": row["decoder_host_ms"] * 1e3 / args.layers})
            if not tapes:  # where the op-by-op decode step's host time goes
                prof = cProfile.Profile()
                with torch.inference_mode():
                    prof.enable()
                    for _ in range(20):
                        runner.execute(plans.decode_plan(batches[0], args.context))
                    prof.disable()
                listing = profile_listing(prof, args.profile_top, cumulative=False)
    result = {**provenance("bench_eager_host", started),
              "note": "CPU, launches faked (no driver cost): host work around the launches of the real eager path",
              "layers": args.layers, "steps": args.steps, "context": args.context, "mixed_tokens": MIXED_TOKENS,
              "rows": rows, "profile_op_by_op_decode": listing}
    if args.out:
        write_json(args.out, result)
    print(markdown_table(rows, [("step", "step"), ("tapes", "tapes"), ("batch", "B"),
                                ("decoder_host_ms", "decoder host ms p50"), ("decoder_host_us_per_layer", "us/layer"),
                                ("step_host_ms", "whole step ms p50"), ("launches_op_by_op", "launches op by op"),
                                ("launches_issued", "launches issued"), ("aten_ops", "aten ops")]))
    print(f"\ncProfile, op-by-op decode step at B = {batches[0]} (20 steps, by own time):\n{listing}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
