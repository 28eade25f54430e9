"""Whole-engine throughput on CPU: the tiny checkpoint, fixed-length streamed requests.

For each concurrency c, c requests of exactly `--frames` frames (min_new_tokens = max_new_tokens)
are submitted at once to a `SyncEngine` (the real engine thread, codec thread and streaming
windows) and run to completion. Reported per c:

- rows/s: Stage 0 delayed rows sampled per wall second (frames + the 8 tail rows per request);
- audio s/s: seconds of audio returned per wall second (25 frames = 1 s);
- step ms: mean wall time of one engine step (Stage 0 forward + sampling + output bookkeeping);
- sched µs/step: the scheduler's own cost, `schedule()` + `update()` timed inside the loop;
- TTFA ms: mean time from submission to a request's first audio chunk.

The tiny model measures engine overhead, not model speed: its talker is 2 layers of width 64.
Usage: python benchmarks/step/bench_engine_cpu.py [--frames 100] [--concurrency 1 4 16] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from common import PhaseTimer, command_line, git_commit, markdown_table, now_iso

from higgs_serve.config.loader import load_deploy_config
from higgs_serve.engine.async_engine import SyncEngine
from higgs_serve.engine.builder import RuntimeOptions
from higgs_serve.engine.core import EngineHooks
from higgs_serve.engine.speech import SpeechRequest
from higgs_serve.model.tiny import write_tiny_model
from higgs_serve.sampling_params import SamplingParams

FRAMES_PER_SECOND = 25
TAIL_ROWS = 8  # the EOC row + 7 ramp rows after the last frame
TEXT = "The old teacher quickly reads the letter and then writes a long reply."
COLUMNS = (
    ("concurrency", "concurrency"),
    ("wall_s", "wall s"),
    ("rows_per_s", "rows/s (Stage 0)"),
    ("audio_s_per_s", "audio s/s"),
    ("steps", "steps"),
    ("step_ms", "step ms"),
    ("sched_us", "sched µs/step"),
    ("ttfa_ms", "TTFA ms (mean)"),
)


def fixed_length_requests(count: int, frames: int, tag: str) -> list[SpeechRequest]:
    """`count` streamed requests of exactly `frames` frames each (min = max), seeds 0..count-1."""
    return [SpeechRequest(f"{tag}-{i}", TEXT, SamplingParams(temperature=0.8, seed=i, max_new_tokens=frames,
                                                             min_new_tokens=frames), stream=True)
            for i in range(count)]


def run_once(engine: SyncEngine, timer: PhaseTimer, concurrency: int, frames: int, tag: str) -> dict:
    requests = fixed_length_requests(concurrency, frames, tag)
    first_chunk: dict[str, float] = {}

    def on_chunk(request_id, chunk):
        first_chunk.setdefault(request_id, time.perf_counter())

    timer.reset()
    steps0 = engine.core.counters.steps
    t0 = time.perf_counter()
    results = engine.generate_batch(requests, on_chunk=on_chunk)
    wall = time.perf_counter() - t0
    steps = engine.core.counters.steps - steps0
    total_frames = sum(len(r.frames) for r in results)
    if total_frames != concurrency * frames:
        raise RuntimeError(f"expected {concurrency * frames} frames, got {total_frames}")
    rows = sum(len(r.rows) for r in results)
    return {
        "concurrency": concurrency,
        "wall_s": wall,
        "rows_per_s": rows / wall,
        "audio_s_per_s": total_frames / FRAMES_PER_SECOND / wall,
        "steps": steps,
        "step_ms": 1e3 * wall / steps,
        "sched_us": 1e6 * timer.seconds / max(steps, 1),
        "ttfa_ms": 1e3 * sum(first_chunk[r.request_id] - t0 for r in requests) / concurrency,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model dir (default: a fresh tiny checkpoint)")
    parser.add_argument("--frames", type=int, default=100, help="frames per request (min = max)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--repeats", type=int, default=2, help="runs per concurrency; the best is kept")
    parser.add_argument("--out", default=None, help="also write the markdown report here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            model = str(Path(tmp) / "tiny")
            write_tiny_model(model, seed=0)
        max_c = max(args.concurrency)
        deploy = load_deploy_config(None, "higgs_multimodal_qwen3", cli_overrides={
            "0": {"devices": "cpu", "max_num_seqs": max_c,
                  "compilation_config": {"cudagraph_capture_sizes": [max_c]}},
            "1": {"devices": "cpu"},
        })
        # the scheduler's share of a step: its schedule() and update() calls, through the engine's hook
        timer = PhaseTimer(timed=("schedule", "update"))
        engine = SyncEngine.from_model(model, deploy, RuntimeOptions(device="cpu"), EngineHooks(profile=timer))
        try:
            run_once(engine, timer, 2, 20, "warmup")
            rows = []
            for c in args.concurrency:
                runs = [run_once(engine, timer, c, args.frames, f"c{c}r{k}") for k in range(args.repeats)]
                rows.append(min(runs, key=lambda r: r["wall_s"]))
                print(f"c={c}: {rows[-1]['audio_s_per_s']:.2f} audio s/s", flush=True)
        finally:
            engine.close()

    table = markdown_table(rows, COLUMNS)
    print(table)
    if args.out:
        report = "\n".join([
            "# Engine throughput on CPU (tiny checkpoint)",
            "",
            f"Command: `{command_line()}`",
            "",
            f"Measured {now_iso()}, commit {git_commit()}, torch {torch.__version__}, "
            f"{torch.get_num_threads()} torch threads, {args.frames} frames per request "
            f"(min = max), streamed, best of {args.repeats} runs per concurrency.",
            "",
            table,
            "",
        ])
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(report)


if __name__ == "__main__":
    main()
