"""benchmarks/last_mile/bench_watermark.py's batched section runs on the CPU (`--smoke`): the lead times
it on the GPU, where it also replays the captured graphs."""

from __future__ import annotations

import json

from support.bench_modules import load_bench

bench_watermark = load_bench("bench_watermark")


def test_the_window_mix_is_one_window_per_stream_with_its_own_context():
    speech = bench_watermark.twenty_seconds_of_speech()[0]
    windows = bench_watermark.window_mix(speech, 40, 5280, seed=1)
    assert len(windows) == 40
    sizes = {w.size for w in windows}
    assert 960 in sizes or 1920 in sizes  # a stream's first windows (no or little context)
    assert 5280 + 24_000 in sizes  # steady chunks with their full 220 ms context
    assert sizes <= {960, 1920, 3840, 7680, 12960, 20640, 29280, 5280 + 18 * 960}  # the 10 s schedule


def test_the_batched_section_runs_on_the_cpu(tmp_path):
    out = tmp_path / "batched.json"
    assert bench_watermark.main(["--device", "cpu", "--sections", "batched", "--smoke", "--out", str(out)]) == 0
    result = json.loads(out.read_text())["batched"]
    assert [row["streams"] for row in result["batches"]] == [1, 3]
    for row in result["batches"]:
        assert row["eager_one_call_wall_ms"] > 0 and row["eager_per_length_wall_ms"] > 0
        assert "graphs_wall_ms" not in row  # CUDA only
    assert result["graph_capture"] is None
