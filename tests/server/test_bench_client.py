"""The serving benchmark's closed loop (benchmarks/serving/bench_serving.py) against a live server over
the fake engine: every request is sent once, by c clients with a connection each, every stream's
audio arrives whole, and a refused request is sent again after the server's Retry-After."""

from __future__ import annotations

import argparse
import asyncio

from fake_engine import FakeEngine, fake_deploy
from live_server import MODEL_NAME, fake_settings, start_threaded_server
from support.bench_modules import load_bench


def client_args(**overrides) -> argparse.Namespace:
    """The fields of bench_serving's arguments that its client reads."""
    values = dict(frames=10, frames_spread=0.0, file_every=0, seed=7, request_timeout=30.0,
                  served_model_name=MODEL_NAME, response_format="pcm", no_stream_field=False,
                  stream_format="audio", word_timestamps="off", max_tries=0, retry_backoff_ms=100.0)
    return argparse.Namespace(**{**values, **overrides})


def test_closed_loop_sends_every_request_once_and_reads_each_stream_whole(tmp_path):
    bench = load_bench("bench_serving")
    engine = FakeEngine(deploy=fake_deploy(max_num_seqs=4, max_tokens=200), chunk_frames=3,
                        frames_per_char=100, step_delay_s=0.01)
    live = start_threaded_server(engine, fake_settings(tmp_path, max_queue=4, max_input_chars=1000))
    args = client_args()
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
    args = client_args(frames=25, seed=3, response_format="mp3", no_stream_field=True)
    try:
        body = load_bench("stream_client").request_body(0, args)
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
    args = client_args(frames=30, seed=3, request_timeout=60.0, stream_format="sse", word_timestamps="on")
    try:
        assert load_bench("stream_client").request_body(0, args)["word_timestamps"] is True
        records = asyncio.run(bench.closed_loop(live.url, [0, 1], 2, args))
    finally:
        live.stop()
    assert all(r.ok and r.num_bytes == 30 * bench.FRAME_SAMPLES * 2 for r in records)
    assert all(r.words_at is not None and r.words_at >= r.arrivals[-1][0] for r in records)
    metrics = bench.alignment_metrics({}, {}, records)
    assert metrics["words_events_requests"] == 2 and metrics["words_lag_ms_p50"] >= 0


def test_a_refused_request_waits_retry_after_and_tries_again(tmp_path):
    """Room for one stream (one sequence, no queue): of three clients two are refused at once
    (429 with Retry-After: 1), wait a second and try again until each is admitted; their TTFA
    counts from the first try, and the level reports the refusals."""
    bench = load_bench("bench_serving")
    engine = FakeEngine(deploy=fake_deploy(max_num_seqs=1, max_tokens=200), chunk_frames=2,
                        frames_per_char=100, step_delay_s=0.03)
    live = start_threaded_server(engine, fake_settings(tmp_path, max_queue=0, max_input_chars=1000))
    try:
        records = asyncio.run(bench.closed_loop(live.url, [0, 1, 2], 3, client_args()))
        gave_up = asyncio.run(bench.closed_loop(live.url, [3, 4, 5], 3, client_args(max_tries=1)))
    finally:
        live.stop()
    assert all(r.ok for r in records), [r.error for r in records if not r.ok]
    retried = [r for r in records if r.refusals]
    assert len(retried) == 2
    for r in retried:
        assert {(x.status, x.retry_after_s) for x in r.refusals} == {(429, 1.0)}
        assert all(x.after_s < 1.0 for x in r.refusals)  # refused at once, not after a wait
        assert r.ttfa_s >= len(r.refusals) * 1.0 > r.admitted_ttfa_s  # from the first try
    m = bench.level_metrics(3, records, window_s=max(r.end for r in records) - min(r.sent for r in records))
    assert (m["completed"], m["failed"], m["refused_requests"], m["gave_up"]) == (3, 0, 2, 0)
    assert m["retry_after_share"] == 1.0 and m["tries_max"] >= 2 and m["admitted_after_retry"] == 2
    assert m["goodput_streams"] == 1  # the two retried streams waited more than the 1 s budget
    # one try each (--max-tries 1): the refused two give up, and are not failures
    assert sorted(r.gave_up for r in gave_up) == [False, True, True]
    assert bench.level_metrics(3, gave_up, window_s=1.0)["failed"] == 0
