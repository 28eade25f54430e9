"""Where a loaded engine's step time goes at a fixed batch: the real engine loop (no HTTP), B
streamed requests of exactly `--frames` frames submitted at once, with the real codec and with
the codec stubbed out (windows delivered as silence at once), so the difference is what Stage 1
costs Stage 0 (GPU sharing and its thread's share of the GIL). Optionally a cProfile of the
engine thread (`--profile`, run separately: profiling slows Python down), and a GPU timeline
(`--gpu-trace`: one more run under torch.profiler, summarised by `gpu_timeline.py`: how long the
GPU was busy, each stream's share, how much they overlapped, the idle gaps).

Reported per run: wall s, engine steps, mean step ms (wall / steps), rows per step, and where
the first audio's time goes: time to the first chunk (TTFA without HTTP), the first engine step's
wall ms (the prefill: with one-step lookahead it launches the prefill and returns) and the
steps taken before the first chunk, with the p50 of the steps after the first.

  PYTHONPATH=src python3 benchmarks/step/profile_engine.py --model /tmp/h4b --load-format dummy \\
      --deploy-config higgs_multimodal_qwen3_full_and_piecewise --batch 64 --frames 250 --profile
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from step.bench_engine_cpu import FRAMES_PER_SECOND, fixed_length_requests  # noqa: E402
from common import (PhaseTimer, command_line, device_description, git_commit, markdown_table,  # noqa: E402
                    now_iso, profile_listing, write_json)
from step.gpu_timeline import summarize_file  # noqa: E402

from higgs_serve.cli import deploy_from_args  # noqa: E402
from higgs_serve.engine.async_engine import SyncEngine  # noqa: E402
from higgs_serve.engine.builder import RuntimeOptions, load_model  # noqa: E402
from higgs_serve.engine.core import EngineHooks  # noqa: E402

CODEC_MODES = ("real", "stubbed", "real-high-priority")


def stub_codec(engine: SyncEngine, samples_per_frame: int) -> None:
    """Deliver every window at once as silence of the right length: no Stage 1 work at all."""
    def submit(job) -> None:
        frames = len(job.frames) - job.trim_front_frames - job.trim_back_frames
        job.deliver(job, np.zeros(frames * samples_per_frame, np.float32))
    engine.core.codec.submit = submit


def high_priority_codec(engine: SyncEngine) -> None:
    """The codec's kernels on a stream of the highest priority, as Stage 0's step stream is
    (model_runner.py), instead of the lowest: whether the eager codec's calls wait for SMs behind
    Stage 0. Decodes already captured as graphs replay on the new stream as well."""
    codec = engine.core.codec
    codec._stream = torch.cuda.Stream(codec.device, priority=-100)


def first_audio(spans: list[tuple[float, float]], t_submit: float, t_first: float) -> dict:
    """TTFA and its parts from the step spans of a run (`spans` starts with the run's first step)."""
    spans = [s for s in spans if s[0] >= t_submit]
    before = [s for s in spans if s[1] <= t_first]
    later = [1e3 * (b[1] - a[1]) for a, b in zip(spans[1:], spans[2:])]
    return {"ttfa_ms": 1e3 * (t_first - t_submit),
            "queue_ms": 1e3 * (spans[0][0] - t_submit) if spans else None,
            "first_step_ms": 1e3 * (spans[0][1] - spans[0][0]) if spans else None,
            "steps_before_first_chunk": len(before),
            "step_p50_ms": float(np.median(later)) if later else None}


def run(engine: SyncEngine, timer: PhaseTimer, batch: int, frames: int, tag: str) -> dict:
    requests = fixed_length_requests(batch, frames, tag)
    first: list[float] = []

    def on_chunk(request_id, chunk) -> None:
        if not first:
            first.append(time.perf_counter())

    steps0 = engine.core.counters.steps
    codec0 = dataclasses.replace(engine.core.codec.counters)
    timer.reset()
    t0 = time.perf_counter()
    results = engine.generate_batch(requests, on_chunk)
    wall = time.perf_counter() - t0
    codec = engine.core.codec.counters
    spans = list(timer.spans)
    steps = engine.core.counters.steps - steps0
    rows = sum(len(r.rows) for r in results)
    return {"run": tag, "batch": batch, "wall_s": wall, "steps": steps, "step_ms": 1e3 * wall / steps,
            "rows_per_step": rows / steps, "audio_s_per_s": sum(len(r.frames) for r in results) / FRAMES_PER_SECOND / wall,
            **first_audio(spans, t0, first[0]), **codec_share(codec0, codec, wall)}


def codec_share(before, after, wall: float) -> dict:
    """Stage 1 over a run, from its counters (0 calls when stubbed): calls, windows per call,
    wall ms per call (host copy included: on a shared GPU this is the call's latency, not its
    GPU time) and the fraction of the run the codec thread spent in calls."""
    calls = after.calls - before.calls
    busy = after.busy_s - before.busy_s
    return {"codec_calls": calls,
            "codec_windows_per_call": (after.windows - before.windows) / calls if calls else None,
            "codec_ms_per_call": 1e3 * busy / calls if calls else None,
            "codec_graph_call_fraction": (after.graph_calls - before.graph_calls) / calls if calls else None,
            "codec_busy_fraction": busy / wall}


def profiled(engine: SyncEngine, timer: PhaseTimer, batch: int, frames: int, tag: str,
             top: int) -> tuple[dict, str]:
    """One run with cProfile on the engine thread, around each step (the engine's profiling hook)."""
    timer.profiler = prof = cProfile.Profile()
    try:
        row = run(engine, timer, batch, frames, tag)
    finally:
        timer.profiler = None
    return row, profile_listing(prof, top)


def gpu_traced(engine: SyncEngine, timer: PhaseTimer, batch: int, frames: int, tag: str) -> tuple[dict, dict]:
    """One run under torch.profiler (device activity only), and the summary of its timeline."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        row = run(engine, timer, batch, frames, tag)
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        return row, summarize_file(f.name)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--load-format", choices=["auto", "dummy"], default="auto")
    p.add_argument("--device", default=None)
    p.add_argument("--deploy-config", default=None)
    p.add_argument("--batch", type=int, nargs="+", default=[64],
                   help="requests per run; several: one run each, on one engine sized for the largest")
    p.add_argument("--frames", type=int, default=250)
    p.add_argument("--codec", nargs="+", choices=list(CODEC_MODES), default=["real", "stubbed"],
                   help="real; stubbed (windows delivered at once as silence); real-high-priority (an "
                        "experiment: the codec on a stream of the step stream's priority instead of the lowest)")
    p.add_argument("--switch-interval-ms", type=float, default=None,
                   help="an experiment: CPython's GIL switch interval for the run (default: CPython's 5 ms)")
    p.add_argument("--profile", action="store_true", help="also one cProfiled run per codec mode")
    p.add_argument("--gpu-trace", action="store_true", help="also one run per codec mode under torch.profiler")
    p.add_argument("--top", type=int, default=None, help="functions listed per profile (with --profile; default 25)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if args.top is not None and not args.profile:
        p.error("--top sets the length of the --profile listing; add --profile")
    args.top = 25 if args.top is None else args.top
    if args.gpu_trace and not torch.cuda.is_available():
        p.error("--gpu-trace traces CUDA kernels: it needs a CUDA device")
    if "real-high-priority" in args.codec and not torch.cuda.is_available():
        p.error("--codec real-high-priority moves the codec to another CUDA stream: it needs a CUDA device")
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1e3)
    options = RuntimeOptions(load_format=args.load_format, device=args.device)
    loaded = load_model(args.model, options)
    # as `higgs-serve serve --max-num-seqs B` would: the profile's capture sizes fitted to B
    deploy = deploy_from_args(argparse.Namespace(deploy_config=args.deploy_config, stage_overrides=None,
                                                 max_num_seqs=max(args.batch), device=args.device), loaded.model_dir)
    rows, profiles, timelines = [], {}, {}
    for codec in args.codec:
        timer = PhaseTimer()  # every step's span, cProfile around steps when asked
        engine = SyncEngine(loaded, deploy, options, EngineHooks(profile=timer))
        try:
            if codec == "stubbed":
                stub_codec(engine, loaded.spec.codec.hop_length)
            elif codec == "real-high-priority":
                high_priority_codec(engine)
            run(engine, timer, min(args.batch[0], 4), 20, f"warm-{codec}")
            for batch in args.batch:
                rows.append({"codec": codec, **run(engine, timer, batch, args.frames, f"{codec}")})
                print(rows[-1], flush=True)
                if args.profile:
                    row, text = profiled(engine, timer, batch, args.frames, f"{codec}-profiled", args.top)
                    rows.append({"codec": codec, **row})
                    profiles[f"{codec}-b{batch}"] = text
                    print(text, flush=True)
                if args.gpu_trace:
                    row, timelines[f"{codec}-b{batch}"] = gpu_traced(engine, timer, batch, args.frames,
                                                                     f"{codec}-gpu-traced")
                    rows.append({"codec": codec, **row})
                    print(timelines[f"{codec}-b{batch}"], flush=True)
        finally:
            engine.close()
    print(markdown_table(rows, [("codec", "codec"), ("run", "run"), ("batch", "B"), ("wall_s", "wall s"),
                                ("steps", "steps"), ("step_ms", "step ms"), ("rows_per_step", "rows/step"),
                                ("audio_s_per_s", "audio s/s"), ("ttfa_ms", "TTFA ms"),
                                ("first_step_ms", "first step ms"), ("steps_before_first_chunk", "steps to 1st chunk"),
                                ("step_p50_ms", "step p50 ms"), ("codec_ms_per_call", "codec ms/call"),
                                ("codec_windows_per_call", "windows/call"), ("codec_busy_fraction", "codec busy")]))
    if args.out:
        write_json(args.out, {"tool": "profile_engine", "command": command_line(), "git_commit": git_commit(),
                              "device": device_description(), "time": now_iso(),
                              "switch_interval_s": sys.getswitchinterval(), "rows": rows,
                              "profiles": profiles, "gpu_timelines": timelines})


if __name__ == "__main__":
    main()
