"""The short pass of benchmarks/limits/bench_fuzz_surfaces.py (issue 40): a real server on the tiny
model, a few hostile requests measured from outside, schemathesis over every POST/DELETE
operation, and seeded random WebSocket sessions of hostile frames. The full pass and its figures:
benchmarks/results/fuzz_surfaces_cpu.json."""

from __future__ import annotations

from support.bench_modules import load_bench


def test_the_short_fuzz_pass_finds_no_5xx_no_traceback_and_no_session_left_open():
    bench = load_bench("bench_fuzz_surfaces")
    result = bench.run(quick=True, seed=40, out=None)
    summary, ws = result["summary"], result["websocket_fuzz"]
    assert summary["5xx"] == 0, result["hostile_requests"]
    assert summary["tracebacks_in_server_log"] == 0, result["server_log_tail_if_tracebacks"]
    assert ws["internal_errors"] == 0 and ws["unended"] == 0, ws
    assert ws["sessions_left_open"] == 0 and summary["health_failures"] == 0
    assert summary["ws_worst_end_s"] <= summary["ws_end_bound_s"], ws
    assert result["schemathesis"]["cases"] > 0 and result["schemathesis"]["failures"] == []
    # loose here (a shared CI machine); the full pass records the real figures
    assert summary["worst_health_ms_single_hostile_request"] < 1000, result["hostile_requests"]
    assert summary["worst_rss_growth_mb"] < 200, result["hostile_requests"]
