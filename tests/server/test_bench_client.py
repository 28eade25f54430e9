"""The serving benchmark's closed loop (benchmarks/serving/bench_serving.py) against a live server over
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
                              served_model_name=MODEL_NAME, response_format="pcm",
                              no_stream_field=False, stream_format="audio", word_timestamps="off")
    try:
        records = asyncio.run(bench.closed_loop(live.url, list(range(12)), 4, args))
    finally:
        live.stop()
    assert [r.index for r in records] == list(range(12))
    assert all(r.ok for r in records), [r.error for r in records if not r.ok]
    assert all(r.num_bytes == 10 * bench.FRAME_SAMPLES * 2 for r in records)  # 10 frames of PCM16
    assert sorted(req.sampling.seed for req in engine.requests) == [7 + i for i in range(12)]


def test_any_format_streams_and_counts_the_frames_asked_for(tmp_path):
    """--response-format mp3 --no-stream-field: an OpenAI client's request, streamed as mp3;
    audio seconds are the frames asked for."""
    bench = load_bench("bench_serving")
    engine = FakeEngine(deploy=fake_deploy(max_num_seqs=2, max_tokens=200), chunk_frames=3,
                        frames_per_char=100)
    live = start_threaded_server(engine, fake_settings(tmp_path, max_queue=2, max_input_chars=1000))
    args = argparse.Namespace(frames=25, frames_spread=0.0, file_every=0, seed=3, request_timeout=30.0,
                              served_model_name=MODEL_NAME, response_format="mp3",
                              no_stream_field=True, stream_format="audio", word_timestamps="off")
    try:
        body = bench.request_body(0, args)
        records = asyncio.run(bench.closed_loop(live.url, list(range(4)), 2, args))
    finally:
        live.stop()
    assert "stream" not in body and body["response_format"] == "mp3"
    assert all(r.ok and r.audio_s == 1.0 for r in records)
    assert all(r.arrivals and 4000 < r.bytes_per_s < 12000 for r in records)  # ~64 kbit/s
    metrics = bench.level_metrics(2, records, 1.0)
    assert metrics["wrong_length"] == 0 and metrics["audio_s_total"] == 4.0


def test_sse_with_word_timestamps_counts_the_audio_and_times_the_words(tmp_path):
    """--stream-format sse --word-timestamps on (issue 42): the deltas' bytes are the stream's
    audio, each request's speech.words event is timed after its last audio, and the level
    reports the words' lag."""
    bench = load_bench("bench_serving")
    engine = FakeEngine(deploy=fake_deploy(max_num_seqs=2, max_tokens=200), chunk_frames=5,
                        frames_per_char=100)
    live = start_threaded_server(engine, fake_settings(tmp_path, max_queue=2, max_input_chars=1000,
                                                       alignment_workers=1))
    args = argparse.Namespace(frames=30, frames_spread=0.0, file_every=0, seed=3, request_timeout=60.0,
                              served_model_name=MODEL_NAME, response_format="pcm",
                              no_stream_field=False, stream_format="sse", word_timestamps="on")
    try:
        assert bench.request_body(0, args)["word_timestamps"] is True
        records = asyncio.run(bench.closed_loop(live.url, [0, 1], 2, args))
    finally:
        live.stop()
    assert all(r.ok and r.num_bytes == 30 * bench.FRAME_SAMPLES * 2 for r in records)
    assert all(r.words_at is not None and r.words_at >= r.arrivals[-1][0] for r in records)
    metrics = bench.alignment_metrics({}, {}, records)
    assert metrics["words_events_requests"] == 2 and metrics["words_lag_ms_p50"] >= 0
