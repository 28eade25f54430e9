"""Where a step's time goes at load (issue 58's budget), read from runs already made: a
bench_serving JSON of a server (the deadline policy off: every decode every step) and the
`timed for the deadline policy` line its config's policy-on server logged on the same machine
(engine/builder.py `time_for_deadlines`: a decode step of n sequences alone, through the
profile's own graphs, launched one ahead of the collect as the loop runs them).

Per level of the bench run:
- live step: the engine's mean step (ms) and rows per step, from the server's metrics;
- timed step: the start-up timing at that many rows (interpolated between the sizes it logged);
- the rest of the live step (live − timed): what the loop adds around the device work at that
  load (scheduling, staging, output processing, the Stage 1 threads and the server sharing the
  host's cores and the GIL, Stage 1's kernels sharing the GPU);
- Stage 1's threads' busy share of the wall time (codec, mark) and the server process's cores;
- audio s/s, and the step a goal of `--goal` audio s/s at that many rows would need.
The bandwidth floor (the talker's bf16 weights read once a step) is drawn beside it.

Usage (from the repo root):
  python benchmarks/step/time_budget.py \\
    --run "saturation, H100=benchmarks/results/admit_sat_off_3f7b77d_h100.json@benchmarks/results/gpu_suite_admit_3f7b77d_h100.txt#saturation" \\
    --run "default profile, H100=benchmarks/results/admit_ht_off_80f52b0_h100.json@benchmarks/results/gpu_suite_admit_80f52b0_h100.txt#high_throughput" \\
    --out benchmarks/results/time_budget_h100.json --plot-dir benchmarks/results
`#TEXT` picks the timing line logged by the server whose label or config contains TEXT.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
from common import write_json  # noqa: E402

WEIGHT_BYTES = 8.0e9  # Qwen3-4B's bf16 weights, read once a decode step
BANDWIDTH = {"h100": 3.35e12, "h200": 4.8e12}  # bytes/s, the datasheets' HBM bandwidth
FRAME_S = 0.04


def timed_steps(log: str, match: str) -> dict[int, float]:
    """{rows: ms} of the first timing line after a stage header containing `match`."""
    text = Path(log).read_text()
    start = next((m.end() for m in re.finditer(r"=== \S*.*", text) if match in m.group(0)), 0)
    line = re.search(r"decode step ms by batch \{([^}]*)\}", text[start:])
    if line is None:
        raise SystemExit(f"{log}: no timing line after a stage naming {match!r}")
    return {int(n): float(ms) for n, ms in (pair.split(":") for pair in line.group(1).split(","))}


def interpolate(steps: dict[int, float], rows: float) -> float:
    sizes = sorted(steps)
    if rows <= sizes[0]:
        return steps[sizes[0]]
    for lo, hi in zip(sizes, sizes[1:]):
        if rows <= hi:
            return steps[lo] + (steps[hi] - steps[lo]) * (rows - lo) / (hi - lo)
    return steps[sizes[-1]]


def budget(label: str, bench: str, log: str, match: str, goal: float) -> dict:
    data = json.loads(Path(bench).read_text())
    gpu = data["device"]["gpus"][0].lower() if data["device"].get("gpus") else ""
    device = "h200" if "h200" in gpu else "h100"
    steps = timed_steps(log, match)
    floor_ms = 1e3 * WEIGHT_BYTES / BANDWIDTH[device]
    levels = []
    for level in data["levels"]:
        live, rows = level.get("engine_step_ms_mean"), level.get("engine_rows_per_step")
        if not live or not rows:
            continue
        timed = interpolate(steps, rows)
        levels.append({
            "concurrency": level["concurrency"], "rows_per_step": rows, "live_step_ms": live,
            "timed_step_ms": timed, "loop_ms": max(0.0, live - timed), "floor_ms": floor_ms,
            "codec_busy_fraction": level.get("codec_busy_fraction"),
            "mark_busy_fraction": level.get("watermark_busy_fraction"),
            "server_cpu_cores": level.get("server_cpu_cores"), "audio_s_per_s": level.get("audio_s_per_s"),
            # the step that `goal` audio s/s would need with this many rows decoding
            "goal_step_ms": 1e3 * rows * FRAME_S / goal,
        })
    return {"label": label, "bench": bench, "log": log, "device": device, "timed_steps_ms": steps,
            "goal_audio_s_per_s": goal, "levels": levels}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", action="append", required=True, metavar="LABEL=BENCH.json@SUITE.log#MATCH")
    p.add_argument("--goal", type=float, default=1000.0, help="audio s/s the budget is drawn against")
    p.add_argument("--out", required=True)
    p.add_argument("--plot-dir", default=None)
    args = p.parse_args(argv)
    runs = []
    for spec in args.run:
        label, _, rest = spec.partition("=")
        bench, _, rest = rest.partition("@")
        log, _, match = rest.partition("#")
        runs.append(budget(label, bench, log, match, args.goal))
    write_json(args.out, {"tool": "time_budget", "runs": runs})
    for run in runs:
        print(run["label"])
        for lv in run["levels"]:
            print(f"  c={lv['concurrency']:>3} rows {lv['rows_per_step']:6.1f}  live {lv['live_step_ms']:6.2f} ms = timed "
                  f"{lv['timed_step_ms']:5.2f} + loop {lv['loop_ms']:5.2f}; codec {lv['codec_busy_fraction']:.2f}, mark "
                  f"{lv['mark_busy_fraction']:.2f}, server cores {lv['server_cpu_cores']:.2f}; {lv['audio_s_per_s']:.0f} "
                  f"audio s/s; goal step {lv['goal_step_ms']:.2f} ms")
    if args.plot_dir:
        from plot import plot_time_budget  # benchmarks/plot.py: the docs site draws it from the same JSON
        print(plot_time_budget(args.out, Path(args.plot_dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
