"""Which eager steps of a serving sweep replay a launch tape, on CPU.

The real engine (scheduler, staging, the runner's eager path with its launch tapes and the Triton
attention backend's host code, output processing) runs bench_serving's workload: closed-loop
clients at each concurrency, 2c requests of exactly `--frames` frames each, texts from
bench_serving's sentences. Every Triton launch is a counting no-op (bench_eager_host's fakes), the
codec is stubbed, and the GEMM choice is the 4B talker's, so what is counted is what the runner
would do on the GPU. Each eager step of the profile is counted by the runner itself
(`ModelRunner.eager_steps`, exported as `higgs_serve_eager_steps_total`): a tape replay, a
recording (op by op while its tape records), a void recording, or op by op without a tape (past
the taped row bound, with cuBLAS GEMMs). The start-up recording of prefill tapes does not run here
(the tapes are added after the engine is built), so its sizes are recorded on first use. On the H200 an op-by-op step costs ~12 ms of wall time against ~4-5 ms taped
(benchmarks/results/step_tapes_264330c_h200.json), so the op-by-op share of a sweep's steps is
time the GPU runs below its pace.

Prompt lengths come from the tiny checkpoint's byte-level tokenizer (600 entries), which splits
text into more tokens than the real one: prompts here are longer than on the real model.

  PYTHONPATH=src python3 benchmarks/step/bench_tape_keys.py [--concurrency 1 2 4 8 16 32 64] [--frames 250] [--out F]
"""

from __future__ import annotations

import argparse
import collections
import logging
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from step.bench_eager_host import HostTritonBackend, fake_launches  # noqa: E402
from serving.stream_client import SENTENCES  # noqa: E402
from common import markdown_table, now_iso, provenance, write_json  # noqa: E402
from step.profile_engine import stub_codec  # noqa: E402

from higgs_serve.config.loader import load_deploy_config  # noqa: E402
from higgs_serve.engine.async_engine import CollectingSink, SyncEngine  # noqa: E402
from higgs_serve.engine.builder import RuntimeOptions, load_model  # noqa: E402
from higgs_serve.engine.speech import SpeechRequest  # noqa: E402
from higgs_serve.model import fused_ops  # noqa: E402
from higgs_serve.model.tiny import write_tiny_model  # noqa: E402
from higgs_serve.sampling_params import SamplingParams  # noqa: E402
from higgs_serve.worker.eager_tapes import EagerTapes  # noqa: E402
from higgs_serve.worker.model_runner import EAGER_OUTCOMES  # noqa: E402

MAX_NUM_SEQS = 64  # the profile's


class StepKinds:
    """The runner's own count of how its eager steps ran (ModelRunner.eager_steps), per level."""

    def __init__(self, runner) -> None:
        self.runner = runner
        self.last = dict(runner.eager_steps)

    def take(self) -> dict:
        now = dict(self.runner.eager_steps)
        delta = {k: now[k] - self.last[k] for k in EAGER_OUTCOMES}
        self.last = now
        return {**delta, "tapes": len(self.runner.tapes.keys)}


def request(index: int, frames: int) -> SpeechRequest:
    params = SamplingParams(temperature=0.8, seed=index, max_new_tokens=frames, min_new_tokens=frames)
    return SpeechRequest(f"r{index}", SENTENCES[index % len(SENTENCES)], params, stream=True)


def closed_loop(engine: SyncEngine, concurrency: int, first: int, count: int, frames: int) -> None:
    """`count` requests from `concurrency` clients, each sending its next as its last one ends."""
    todo = collections.deque(range(first, first + count))
    active: dict[int, CollectingSink] = {}
    while todo or active:
        while todo and len(active) < concurrency:
            i = todo.popleft()
            active[i] = sink = CollectingSink(None, f"r{i}")
            engine.core.submit(request(i, frames), sink)
        finished = [i for i, sink in active.items() if sink.done.is_set()]
        for i in finished:
            if active.pop(i).error is not None:
                raise RuntimeError(f"request r{i} failed")
        if not finished:
            time.sleep(0.0005)


def build_engine(model_dir: Path, frames: int) -> SyncEngine:
    """The default (high-throughput) profile on CPU in bfloat16 (the skinny GEMM path), with the
    runner's eager path as on the GPU: Triton ops, the Triton backend's host code, launch tapes."""
    options = RuntimeOptions(device="cpu", dtype="bfloat16")
    loaded = load_model(str(model_dir), options)
    deploy = load_deploy_config(None, "higgs_multimodal_qwen3", stage_overrides={
        "0": {"devices": "cpu", "num_gpu_blocks": MAX_NUM_SEQS * ((frames + 400) // 16 + 2) + 1},
        "1": {"devices": "cpu"}})
    loaded.talker.backbone.set_ops(fused_ops.TritonOps)
    engine = SyncEngine(loaded, deploy, options)
    runner = engine.core.runner
    runner.backend = HostTritonBackend()
    runner.tapes = EagerTapes(loaded.device, runner._persistent_tensors)
    stub_codec(engine, loaded.spec.codec.hop_length)
    return engine


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--frames", type=int, default=250)
    p.add_argument("--warmup", type=int, default=2, help="untimed requests before the first level, as bench_serving")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if max(args.concurrency) > MAX_NUM_SEQS:
        p.error(f"--concurrency above the profile's max_num_seqs {MAX_NUM_SEQS}")
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    started = now_iso()
    rows = []
    with tempfile.TemporaryDirectory() as tmp, fake_launches(four_b_gemms=True):
        write_tiny_model(Path(tmp))
        engine = build_engine(Path(tmp), args.frames)
        try:
            kinds = StepKinds(engine.core.runner)
            index = 0
            if args.warmup:
                closed_loop(engine, 1, index, args.warmup, args.frames)
                index += args.warmup
            start = kinds.take()
            for c in args.concurrency:
                count = max(2 * c, 6)
                closed_loop(engine, c, index, count, args.frames)
                index += count
                row = {"concurrency": c, "requests": count, **kinds.take()}
                row["steps"] = sum(row[k] for k in EAGER_OUTCOMES)
                row["op_by_op_share"] = (row["steps"] - row["replay"]) / max(1, row["steps"])
                rows.append(row)
                print(f"c={c}: {row}", flush=True)
        finally:
            engine.close()
    columns = [("concurrency", "c"), ("requests", "requests"), ("steps", "eager steps"), ("replay", "replayed"),
               ("recorded", "recorded"), ("void", "void"), ("op_by_op", "op by op, no tape"),
               ("tapes", "tapes after"), ("op_by_op_share", "share not replayed")]
    print(markdown_table(rows, columns))
    print(f"warm-up ({args.warmup} requests): {start}")
    if args.out:
        write_json(args.out, {**provenance("bench_tape_keys", started),
                              "note": "CPU, launches faked, codec stubbed: the kind of each eager step of the "
                                      "high-throughput profile under bench_serving's closed-loop workload",
                              "frames": args.frames, "warmup": args.warmup, "warmup_steps": start,
                              "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
