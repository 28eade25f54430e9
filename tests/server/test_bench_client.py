"""The serving benchmark's closed loop (benchmarks/bench_serving.py) against a live server over
the fake engine: every request is sent once, by c clients with a connection each, and every
stream's audio arrives whole."""

from __future__ import annotations

import argparse
import asyncio

from fake_engine import FakeEngine, fake_deploy
from live_server import MODEL_NAME, fake_settings, start_threaded_server
from support.bench_modules import load_bench


def test_closed_loop_sends_every_request_once_and_reads_each_stream_whole(tmp_path):
    bench = load_bench("bench_serving")
    engine = FakeEngine(deploy=fake_deploy(max_num_seqs=4, max_tokens=200), chunk_frames=3,
                        frames_per_char=100, step_delay_s=0.01)
    live = start_threaded_server(engine, fake_settings(tmp_path, max_queue=4, max_input_chars=1000))
    args = argparse.Namespace(frames=10, frames_spread=0.0, file_every=0, seed=7, request_timeout=30.0,
                              served_model_name=MODEL_NAME)
    try:
        records = asyncio.run(bench.closed_loop(live.url, list(range(12)), 4, args))
    finally:
        live.stop()
    assert [r.index for r in records] == list(range(12))
    assert all(r.ok for r in records), [r.error for r in records if not r.ok]
    assert all(r.num_bytes == 10 * bench.FRAME_SAMPLES * 2 for r in records)  # 10 frames of PCM16
    assert sorted(req.sampling.seed for req in engine.requests) == [7 + i for i in range(12)]
