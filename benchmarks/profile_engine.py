"""Where a loaded engine's step time goes at a fixed batch: the real engine loop (no HTTP), B
streamed requests of exactly `--frames` frames submitted at once, with the real codec and with
the codec stubbed out (windows delivered as silence at once), so the difference is what Stage 1
costs Stage 0 (GPU sharing and its thread's share of the GIL). Optionally a cProfile of the
engine thread (`--profile`, run separately: profiling slows Python down).

Reported per run: wall s, engine steps, mean step ms (wall / steps), rows per step.

  PYTHONPATH=src python3 benchmarks/profile_engine.py --model /tmp/h4b --load-format dummy \\
      --deploy-config higgs_multimodal_qwen3_full_and_piecewise --batch 64 --frames 250 --profile
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine_cpu import FRAMES_PER_SECOND, fixed_length_requests  # noqa: E402
from common import command_line, device_description, git_commit, markdown_table, now_iso, write_json  # noqa: E402

from higgs_serve.cli import deploy_from_args  # noqa: E402
from higgs_serve.engine.async_engine import SyncEngine  # noqa: E402
from higgs_serve.engine.builder import RuntimeOptions, load_model  # noqa: E402


def stub_codec(engine: SyncEngine, samples_per_frame: int) -> None:
    """Deliver every window at once as silence of the right length: no Stage 1 work at all."""
    def submit(job) -> None:
        frames = len(job.frames) - job.trim_front_frames - job.trim_back_frames
        job.deliver(job, np.zeros(frames * samples_per_frame, np.float32))
    engine.core.codec.submit = submit


def run(engine: SyncEngine, batch: int, frames: int, tag: str) -> dict:
    requests = fixed_length_requests(batch, frames, tag)
    steps0 = engine.core.counters.steps
    t0 = time.perf_counter()
    results = engine.generate_batch(requests)
    wall = time.perf_counter() - t0
    steps = engine.core.counters.steps - steps0
    rows = sum(len(r.rows) for r in results)
    return {"run": tag, "batch": batch, "wall_s": wall, "steps": steps, "step_ms": 1e3 * wall / steps,
            "rows_per_step": rows / steps, "audio_s_per_s": sum(len(r.frames) for r in results) / FRAMES_PER_SECOND / wall}


def profiled(engine: SyncEngine, batch: int, frames: int, tag: str, top: int) -> tuple[dict, str]:
    """One run with cProfile on the engine thread (the loop restarts on the next submit)."""
    prof = cProfile.Profile()
    step = engine.core.step

    def profiled_step() -> bool:
        prof.enable()
        try:
            return step()
        finally:
            prof.disable()

    engine.core.step = profiled_step
    try:
        row = run(engine, batch, frames, tag)
    finally:
        engine.core.step = step
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return row, out.getvalue()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--load-format", choices=["auto", "dummy"], default="auto")
    p.add_argument("--device", default=None)
    p.add_argument("--deploy-config", default=None)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--frames", type=int, default=250)
    p.add_argument("--profile", action="store_true", help="also one cProfiled run per codec mode")
    p.add_argument("--top", type=int, default=None, help="functions listed per profile (with --profile; default 25)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if args.top is not None and not args.profile:
        p.error("--top sets the length of the --profile listing; add --profile")
    args.top = 25 if args.top is None else args.top
    options = RuntimeOptions(load_format=args.load_format, device=args.device)
    loaded = load_model(args.model, options)
    # as `higgs-serve serve --max-num-seqs B` would: the profile's capture sizes fitted to B
    deploy = deploy_from_args(argparse.Namespace(deploy_config=args.deploy_config, stage_overrides=None,
                                                 max_num_seqs=args.batch, device=args.device), loaded.model_dir)
    rows, profiles = [], {}
    for codec in ("real", "stubbed"):
        engine = SyncEngine(loaded, deploy, options)
        try:
            if codec == "stubbed":
                stub_codec(engine, loaded.spec.codec.hop_length)
            run(engine, min(args.batch, 4), 20, f"warm-{codec}")
            rows.append({"codec": codec, **run(engine, args.batch, args.frames, f"{codec}")})
            print(rows[-1], flush=True)
            if args.profile:
                row, text = profiled(engine, args.batch, args.frames, f"{codec}-profiled", args.top)
                rows.append({"codec": codec, **row})
                profiles[codec] = text
                print(text, flush=True)
        finally:
            engine.close()
    print(markdown_table(rows, [("codec", "codec"), ("run", "run"), ("batch", "B"), ("wall_s", "wall s"),
                                ("steps", "steps"), ("step_ms", "step ms"), ("rows_per_step", "rows/step"),
                                ("audio_s_per_s", "audio s/s")]))
    if args.out:
        write_json(args.out, {"tool": "profile_engine", "command": command_line(), "git_commit": git_commit(),
                              "device": device_description(), "time": now_iso(), "rows": rows,
                              "profiles": profiles})


if __name__ == "__main__":
    main()
