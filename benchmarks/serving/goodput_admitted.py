"""bench_serving.py, with goodput also counted over the requests the server admitted.

bench_serving's goodput counts a stream's time to first audio from its first try: a request a
full server refused and that was admitted when it retried is never good, however well it then
played. That is what its listener waited. Beside it, this run adds the server's side of it,
what it does with the streams it takes (issue 53): per level, `goodput_admitted_*` counts the
completed streams whose admitted try had its first audio within the TTFA budget and that never
stalled past the threshold (the same rules, bench_serving's playback module), and
`goodput_admitted_vs_best` sets their audio per second against the run's best audio s/s.

Every argument is bench_serving's; it needs the bench_serving of issue 53 item 6 (goodput,
refusals and their retries: serving/playback.py, serving/refusals.py).

Usage: python benchmarks/serving/goodput_admitted.py <bench_serving arguments>
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
import bench_serving  # noqa: E402
from playback import continuity_metrics, heard  # noqa: E402

_level_metrics = bench_serving.level_metrics


def level_metrics(concurrency, records, window_s, ttfa_budget_s=1.0, stall_threshold_s=0.1) -> dict:
    metrics = _level_metrics(concurrency, records, window_s, ttfa_budget_s, stall_threshold_s)
    streams = [r for r in records if r.ok and r.streamed]
    admitted = continuity_metrics([heard(r.admitted_ttfa_s, r.arrivals, r.bytes_per_s, r.audio_s) for r in streams],
                                  len(streams), window_s, ttfa_budget_s, stall_threshold_s)
    metrics.update({f"goodput_admitted_{key[len('goodput_'):]}": value
                    for key, value in admitted.items() if key.startswith("goodput_")})
    return metrics


def best_of_run(levels: list[dict]) -> dict | None:
    best = _best_of_run(levels)
    if best is not None:
        for level in levels:
            good = level.get("goodput_admitted_audio_s_per_s")
            level["goodput_admitted_vs_best"] = good / best["audio_s_per_s"] if good is not None else None
    return best


_best_of_run = bench_serving.best_of_run
bench_serving.level_metrics = level_metrics
bench_serving.best_of_run = best_of_run

if __name__ == "__main__":
    sys.exit(bench_serving.main())
