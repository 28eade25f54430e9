"""The engine loop's own host work per step at B running requests, on CPU.

The real engine (scheduler, staging into the input buffers, result collection, output processing
into codec windows) runs the tiny checkpoint with the codec stubbed (windows delivered at once as
silence). Each phase of the loop is timed on its own, so the talker's CPU compute (which a GPU
does instead) is in none of them: `schedule` (the plan), `stage` (host buffers, inside the
launch), `collect` (rows of the step, minus the wait), `update` (the scheduler takes them),
`outputs` (rows -> frames -> windows). This is the host work that runs beside the GPU at every
step; at 256 sequences it has to stay well under the ~6 ms GPU step, and it shares the GIL with the
codec thread and the HTTP server.

  PYTHONPATH=src python3 benchmarks/step/bench_engine_host.py [--batch 64 256] [--frames 100] [--out F]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from step.bench_engine_cpu import fixed_length_requests  # noqa: E402
from common import PhaseTimer, markdown_table, now_iso, provenance, write_json  # noqa: E402
from step.profile_engine import stub_codec  # noqa: E402

from higgs_serve.config.loader import load_deploy_config  # noqa: E402
from higgs_serve.engine.async_engine import SyncEngine  # noqa: E402
from higgs_serve.engine.builder import RuntimeOptions, load_model  # noqa: E402
from higgs_serve.engine.core import EngineHooks  # noqa: E402
from higgs_serve.model.tiny import write_tiny_model  # noqa: E402

PHASES = ("schedule", "stage", "collect", "update", "outputs")


def time_staging(engine: SyncEngine, totals: PhaseTimer) -> None:
    """Count the runner's staging (host buffers) as its own phase, inside "launch"."""
    stager = engine.core.runner.stager
    stage = stager.stage

    def timed(plan):
        t0 = time.perf_counter()
        try:
            return stage(plan)
        finally:
            totals.add("stage", time.perf_counter() - t0)

    stager.stage = timed


def measure(model_dir: Path, batch: int, frames: int, rounds: int) -> dict:
    options = RuntimeOptions(device="cpu")
    loaded = load_model(str(model_dir), options)
    deploy = load_deploy_config(None, "higgs_multimodal_qwen3",
                                stage_overrides={"0": {"max_num_seqs": batch, "devices": "cpu",
                                                       "num_gpu_blocks": batch * (frames // 16 + 16)},
                                                 "1": {"devices": "cpu"}})
    totals = PhaseTimer(timed=PHASES)  # "stage" is added by time_staging (inside "launch")
    engine = SyncEngine(loaded, deploy, options, EngineHooks(profile=totals))
    try:
        stub_codec(engine, loaded.spec.codec.hop_length)
        time_staging(engine, totals)
        engine.generate_batch(fixed_length_requests(min(batch, 4), 10, "warm"))
        best: dict[str, float] = {}
        for r in range(rounds):
            totals.reset()
            engine.generate_batch(fixed_length_requests(batch, frames, f"r{r}"))
            steps = totals.calls["outputs"]
            for phase in PHASES:
                ms = 1e3 * totals.by_phase[phase] / max(1, steps)
                best[phase] = min(best.get(phase, ms), ms)
        row = {"batch": batch, "frames": frames, "steps": steps, **{f"{p}_ms": best[p] for p in PHASES}}
        row["host_ms"] = sum(best[p] for p in PHASES)
        return row
    finally:
        engine.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    p.add_argument("--frames", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3, help="runs per batch; each phase's best mean is reported")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    started = now_iso()
    with tempfile.TemporaryDirectory() as tmp:
        write_tiny_model(Path(tmp))
        rows = [measure(Path(tmp), batch, args.frames, args.rounds) for batch in args.batch]
    columns = [("batch", "B"), ("steps", "steps"), *((f"{p}_ms", f"{p} ms") for p in PHASES), ("host_ms", "sum ms")]
    print(markdown_table(rows, columns))
    if args.out:
        write_json(args.out, {**provenance("bench_engine_host", started),
                              "note": "CPU; per engine step, best of --rounds runs; talker compute and codec excluded",
                              "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
