"""bench_serving's arithmetic (benchmarks/serving/): the player that starts at the first byte, the
stalled share and goodput, refusals and retries, request variants, what two /metrics scrapes
say, and the request bodies. Pure functions, fed synthetic arrivals and scrapes."""

from __future__ import annotations

import email.utils
import time

import pytest
from support.bench_modules import load_bench

bench_serving = load_bench("bench_serving")
playback = load_bench("playback")
refusals = load_bench("refusals")
server_metrics = load_bench("server_metrics")
stream_client = load_bench("stream_client")
variants = load_bench("variants")

BPS = 48_000.0  # bytes per second of 24 kHz s16le
SECOND = 48_000  # one second of it


def _chunks(*gaps_s: float, at: float = 0.0) -> list[tuple[float, int]]:
    """A stream of 1 s chunks, each arriving when the one before has played, plus the gap given
    (a stall of that length at 1x): `_chunks(0.15)` runs dry once, for 150 ms."""
    arrivals, t = [(at, SECOND)], at
    for gap in gaps_s:
        t += 1.0 + gap
        arrivals.append((t, SECOND))
    return arrivals


# ------------------------------------------------------------------------------ the player
def test_sentences_are_fixed_english_of_10_to_25_words():
    sentences = stream_client.SENTENCES
    assert len(sentences) == 50 and len(set(sentences)) == 50
    for s in sentences:
        assert 10 <= len(s.split()) <= 25, s


def test_playback_stalls_pause_and_resume():
    # 1 s of audio at t=0, 1 s more at t=0.5 (buffer never empty), then 1 s at t=2.5: the player
    # ran dry at t=2.0, so one 0.5 s stall, then it resumes.
    arrivals = [(0.0, SECOND), (0.5, SECOND), (2.5, SECOND), (3.0, SECOND // 2)]
    assert playback.playback_stalls(arrivals, BPS) == [(pytest.approx(2.0), pytest.approx(0.5))]  # after 2 s
    # a steady stream arriving faster than real time never stalls
    assert playback.playback_stalls([(i * 0.5, SECOND) for i in range(10)], BPS) == []


def test_gapless_start_is_the_earliest_stall_free_start():
    # stalls 0.5 s when started at the first byte: starting 0.5 s later plays it all without a gap
    arrivals = [(0.0, SECOND), (0.5, SECOND), (2.5, SECOND), (3.0, SECOND // 2)]
    assert playback.gapless_start(arrivals, BPS) == pytest.approx(0.5)
    # a stream that never stalls can start at its first byte
    assert playback.gapless_start([(0.2 + i * 0.5, SECOND) for i in range(10)], BPS) == pytest.approx(0.2)
    # a 40 ms first chunk, then the next after 75 ms: playback must wait 35 ms
    assert playback.gapless_start([(0.0, 1_920), (0.075, SECOND)], BPS) == pytest.approx(0.035)
    assert playback.gapless_start([], BPS) is None


def test_behind_is_the_sum_of_the_stalls():
    for gaps in [(0.15,), (0.09,), (0.06, 0.06), (0.0, 0.3, 0.02), ()]:
        arrivals = _chunks(*gaps, at=5.0)
        stalls = playback.playback_stalls(arrivals, BPS)
        assert playback.behind_s(arrivals, BPS) == pytest.approx(sum(s for _, s in stalls))
        assert sum(s for _, s in stalls) == pytest.approx(sum(gaps))
    assert playback.behind_s([], BPS) == 0.0


def _heard(*gaps_s: float, ttfa_s: float = 0.1):
    arrivals = _chunks(*gaps_s)
    return playback.heard(ttfa_s, arrivals, BPS, len(arrivals) * 1.0)


def test_a_150_ms_gap_stalls_a_stream_and_a_90_ms_gap_does_not():
    streams = [_heard(0.15), _heard(0.09), _heard(), _heard(0.06, 0.06)]
    m = playback.continuity_metrics(streams, streamed_requests=4, window_s=2.0, ttfa_budget_s=1.0,
                                    stall_threshold_s=0.1)
    # the sum rule (a player 120 ms behind after two 60 ms stalls is stalled); one gap: 150 ms only
    assert (m["stalled_streams"], m["stalled_share"]) == (2, 0.5)
    assert (m["stalled_one_gap_streams"], m["stalled_one_gap_share"]) == (1, 0.25)
    assert m["stream_behind_ms_max"] == pytest.approx(150.0)
    # goodput: the 90 ms stream (2 s of audio) and the clean one (1 s), over a 2 s window
    assert (m["goodput_streams"], m["goodput_share"]) == (2, 0.5)
    assert m["goodput_audio_s"] == pytest.approx(3.0) and m["goodput_audio_s_per_s"] == pytest.approx(1.5)


def test_goodput_needs_first_audio_within_the_budget():
    late, on_time = _heard(ttfa_s=1.2), _heard(ttfa_s=0.99)
    m = playback.continuity_metrics([late, on_time], streamed_requests=3, window_s=1.0, ttfa_budget_s=1.0,
                                    stall_threshold_s=0.1)
    assert m["stalled_streams"] == 0  # the late one plays without a gap, yet no listener waits 1.2 s
    assert (m["goodput_streams"], m["goodput_share"]) == (1, pytest.approx(1 / 3))  # a failed one counts
    assert playback.is_good(late, ttfa_budget_s=1.5, stall_threshold_s=0.1)
    empty = playback.continuity_metrics([], streamed_requests=0, window_s=1.0, ttfa_budget_s=1.0,
                                        stall_threshold_s=0.1)
    assert empty["stalled_share"] is None and empty["goodput_share"] is None and empty["goodput_streams"] == 0


# ------------------------------------------------------------------------------ refusals
def test_retry_after_reads_seconds_and_dates():
    assert refusals.parse_retry_after("1") == 1.0 and refusals.parse_retry_after(" 2.5 ") == 2.5
    assert refusals.parse_retry_after(None) is None and refusals.parse_retry_after("soon") is None
    assert refusals.parse_retry_after("-3") == 0.0
    now = time.time()
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert refusals.parse_retry_after(date, now=now) == pytest.approx(30.0, abs=1.0)


def test_a_refused_client_waits_retry_after_or_a_doubling_backoff():
    named = refusals.Refusal(503, 0.01, 1.0)
    bare = refusals.Refusal(503, 0.01, None)
    assert refusals.retry_wait_s(named, tries=3, backoff_s=0.1) == 1.0
    assert [refusals.retry_wait_s(bare, t, 0.1) for t in (1, 2, 3)] == pytest.approx([0.1, 0.2, 0.4])
    assert refusals.retry_wait_s(bare, 10, 0.1) == refusals.MAX_BACKOFF_S


def test_refusal_metrics_count_requests_answers_and_tries():
    r = refusals.Refusal
    per_request = [[], [r(503, 0.004, 1.0)], [r(503, 0.002, 1.0), r(429, 0.010, None)], [r(503, 0.006, 1.0)]]
    m = refusals.refusal_metrics(per_request, final_status=[200, 200, 200, 503])
    assert (m["refused_requests"], m["refused_share"], m["refusals"]) == (3, 0.75, 4)
    assert m["refusal_statuses"] == {"429": 1, "503": 3}
    assert (m["refusals_with_retry_after"], m["retry_after_share"], m["retry_after_s_max"]) == (3, 0.75, 1.0)
    assert m["refusal_ms_p50"] == pytest.approx(5.0) and m["refusal_ms_p95"] == pytest.approx(9.4)
    assert (m["tries_per_request_mean"], m["tries_max"]) == (pytest.approx(2.0), 3)
    assert (m["admitted_after_retry"], m["gave_up"]) == (2, 1)
    none = refusals.refusal_metrics([[], []], [200, 200])
    assert (none["refused_share"], none["retry_after_share"], none["refusal_ms_p50"]) == (0.0, None, None)


# ------------------------------------------------------------------------------ a level
def test_level_metrics_follow_the_reference_definitions():
    rec = stream_client.RequestRecord
    frames = 25
    n = frames * stream_client.FRAME_SAMPLES * 2  # 1 s of audio
    a = rec(index=0, sent=0.0, frames=frames, status=200, first_audio=0.2, end=0.5, num_bytes=n, arrivals=[(0.2, n)],
            server_ttfa_ms=150.0)
    b = rec(index=1, sent=0.1, frames=frames, status=200, first_audio=0.4, end=1.1, num_bytes=n,
            arrivals=[(0.4, n // 2), (1.1, n // 2)])  # 0.5 s buffered at 0.4, next bytes at 1.1: 0.2 s stall
    bad = rec(index=2, sent=0.0, status=500, error="boom", end=0.01)
    m = bench_serving.level_metrics(2, [a, b, bad], window_s=1.1)
    assert (m["completed"], m["failed"], m["wrong_length"]) == (2, 1, 0)
    assert m["ttfa_ms_p50"] == pytest.approx(250.0)  # TTFA 200 and 300 ms
    assert m["rtf_mean"] == pytest.approx((0.5 + 1.0) / 2)  # latency / audio seconds
    assert m["audio_s_per_s"] == pytest.approx(2.0 / 1.1)
    assert m["requests_per_s"] == pytest.approx(2 / 1.1)
    assert m["underrun_requests"] == 1 and m["stall_s_total"] == pytest.approx(0.2)
    assert (m["stalls_in_first_s"], m["stalls_later"]) == (1, 0)  # b ran dry after 0.5 s of audio
    # a: gapless from its first byte (200 ms); b: 0.2 s later than its first byte (500 ms)
    assert m["gapless_ms_p50"] == pytest.approx(350.0)
    assert m["outside_server_ms_p50"] == pytest.approx(50.0)  # only a reports the server's share
    assert "500" in m["errors"][0]
    # b is 200 ms behind: stalled; a is goodput, one of the three streamed requests
    assert (m["stalled_streams"], m["stalled_share"]) == (1, 0.5)
    assert (m["goodput_streams"], m["goodput_share"]) == (1, pytest.approx(1 / 3))
    assert m["goodput_audio_s_per_s"] == pytest.approx(1.0 / 1.1) and m["goodput_ratio"] == pytest.approx(0.5)
    assert m["refused_requests"] == 0 and m["tries_per_request_mean"] == 1.0


def test_a_retried_request_counts_its_ttfa_from_the_first_try_and_a_gave_up_one_is_no_failure():
    rec, refusal = stream_client.RequestRecord, refusals.Refusal
    n = 25 * stream_client.FRAME_SAMPLES * 2
    retried = rec(index=0, sent=0.0, frames=25, status=200, first_audio=1.15, end=1.5, num_bytes=n,
                  arrivals=[(1.15, n)], refusals=[refusal(503, 0.005, 1.0)], admitted_sent=1.005,
                  server_ttfa_ms=100.0)
    gave_up = rec(index=1, sent=0.0, status=503, error="busy", end=3.0,
                  refusals=[refusal(503, 0.005, 1.0)] * 3)
    assert retried.ttfa_s == pytest.approx(1.15) and retried.admitted_ttfa_s == pytest.approx(0.145)
    assert gave_up.gave_up and not retried.gave_up
    m = bench_serving.level_metrics(2, [retried, gave_up], window_s=3.0)
    assert (m["completed"], m["failed"], m["errors"]) == (1, 0, [])
    assert (m["refused_requests"], m["gave_up"], m["admitted_after_retry"], m["tries_max"]) == (2, 1, 1, 4)
    assert m["ttfa_admitted_try_ms_p50"] == pytest.approx(145.0)
    assert m["outside_server_ms_p50"] == pytest.approx(45.0)  # the server saw only the admitted try
    assert m["stalled_streams"] == 0 and m["goodput_streams"] == 0  # 1.15 s past the 1 s budget
    assert bench_serving.level_metrics(2, [retried], 3.0, ttfa_budget_s=1.2)["goodput_streams"] == 1


def test_goodput_against_the_best_level_of_the_run():
    levels = [{"concurrency": 8, "variant": "pcm", "audio_s_per_s": 20.0, "goodput_audio_s_per_s": 20.0},
              {"concurrency": 64, "variant": "pcm", "audio_s_per_s": 25.0, "goodput_audio_s_per_s": 5.0},
              {"concurrency": 1, "audio_s_per_s": None, "goodput_audio_s_per_s": None}]
    assert bench_serving.best_of_run(levels) == {"audio_s_per_s": 25.0, "concurrency": 64, "variant": "pcm"}
    assert [lv["goodput_vs_best"] for lv in levels] == [0.8, 0.2, None]
    assert bench_serving.best_of_run([]) is None


# ------------------------------------------------------------------------------ variants
def test_variants_name_format_sse_words_and_levels():
    v = variants.parse_variant("pcm+sse+words@64", [1, 4])
    assert (v.response_format, v.stream_format, v.word_timestamps, v.levels) == ("pcm", "sse", "on", (64,))
    assert v.name == "pcm+sse+words"
    plain = variants.parse_variant("mp3", [1, 4], stream_format="audio")
    assert (plain.name, plain.levels) == ("mp3", (1, 4))
    for bad in ("pcm+words", "pcm+mp3", "sse", "pcm@", "pcm@0", "pcm@x", "wave"):
        with pytest.raises(ValueError):
            variants.parse_variant(bad, [1])


def test_level_plan_runs_lowest_concurrency_first_then_the_variants_in_order():
    parse = variants.parse_variant
    plan = variants.level_plan([parse("pcm@1,16,256", [1]), parse("mp3@256", [1]), parse("pcm+sse@16,1", [1])])
    assert [(c, v.name) for c, v in plan] == [(1, "pcm"), (1, "pcm+sse"), (16, "pcm"), (16, "pcm+sse"),
                                               (256, "pcm"), (256, "mp3")]


def test_bench_serving_takes_variants_or_formats():
    args = bench_serving.parse_args(["--model", "m", "--concurrency", "1", "64",
                                     "--variants", "pcm", "aac@256", "pcm+sse+words@64"])
    assert [v.name for v in args.variants] == ["pcm", "aac", "pcm+sse+words"]
    assert args.concurrency == [1, 64, 256] and args.response_formats == ["pcm", "aac"]
    formats = bench_serving.parse_args(["--model", "m", "--response-format", "pcm", "mp3"])
    assert [(v.name, v.levels) for v in formats.variants] == [("pcm", (1, 4, 16, 64)), ("mp3", (1, 4, 16, 64))]
    assert formats.response_formats == ["pcm", "mp3"] and formats.response_format == "pcm"
    assert bench_serving.parse_args(["--model", "m"]).response_formats == ["pcm"]
    for bad in (["--variants", "pcm", "--response-format", "mp3"], ["--variants", "pcm+sse", "--no-stream-field"],
                ["--variants", "pcm+words"], ["--word-timestamps", "on"], ["--stall-threshold-ms", "0"]):
        with pytest.raises(SystemExit):
            bench_serving.parse_args(["--model", "m", *bad])


# ------------------------------------------------------------------------------ /metrics
def test_engine_step_metrics_from_two_scrapes():
    before = dict(zip(server_metrics.ENGINE_SERIES, (1.0, 100.0, 6000.0)))
    after = dict(zip(server_metrics.ENGINE_SERIES, (1.5, 200.0, 12400.0)))
    m = server_metrics.engine_step_metrics(before, after)
    assert m == {"engine_steps": 100, "engine_step_ms_mean": pytest.approx(5.0), "engine_rows_per_step": pytest.approx(64.0)}
    assert server_metrics.engine_step_metrics({}, after)["engine_step_ms_mean"] is None  # a server without them


def test_codec_batching_from_two_scrapes():
    before = dict(zip(server_metrics.CODEC_SERIES, (10.0, 30.0, 5.0, 1.0)))
    after = dict(zip(server_metrics.CODEC_SERIES, (20.0, 110.0, 13.0, 4.0)))
    assert server_metrics.codec_metrics(before, after, window_s=10.0) == {
        "codec_windows_per_call": pytest.approx(8.0), "codec_graph_call_fraction": pytest.approx(0.8),
        "codec_busy_fraction": pytest.approx(0.3)}
    assert server_metrics.codec_metrics({}, after, 10.0)["codec_windows_per_call"] is None


def test_server_ttfa_from_two_scrapes():
    before = dict(zip(server_metrics.SERVER_TTFA_SERIES, (2.0, 10.0)))
    after = dict(zip(server_metrics.SERVER_TTFA_SERIES, (6.0, 50.0)))
    assert server_metrics.server_ttfa_metrics(before, after) == {"server_ttfa_ms_mean": pytest.approx(100.0)}
    assert server_metrics.server_ttfa_metrics({}, after) == {"server_ttfa_ms_mean": None}


def _exposition(stalls: float, slack_buckets: tuple[float, ...], slack_sum: float, wait_sum: float,
                wait_count: float, depth: float) -> str:
    bounds = ("0.1", "0.5", "1.0", "+Inf")
    slack = "\n".join(f'higgs_serve_stream_slack_seconds_bucket{{stage="0",le="{b}"}} {c}'
                      for b, c in zip(bounds, slack_buckets))
    return f"""# HELP higgs_serve_stream_stalls Streams that ran dry, as the server sees them.
# TYPE higgs_serve_stream_stalls counter
higgs_serve_stream_stalls_total{{reason="late"}} {stalls}
# TYPE higgs_serve_stream_slack_seconds histogram
{slack}
higgs_serve_stream_slack_seconds_sum{{stage="0"}} {slack_sum}
higgs_serve_stream_slack_seconds_count{{stage="0"}} {slack_buckets[-1]}
# TYPE higgs_serve_queue_wait_seconds summary
higgs_serve_queue_wait_seconds_sum {wait_sum}
higgs_serve_queue_wait_seconds_count {wait_count}
# TYPE higgs_serve_admission_waiting gauge
higgs_serve_admission_waiting {depth}
# TYPE higgs_serve_queue_depth gauge
higgs_serve_queue_depth 7.0
higgs_serve_stage0_steps_total{{mode="full"}} 12.0
"""


def test_playback_series_are_recorded_whatever_the_server_names_them():
    before = server_metrics.parse_exposition(_exposition(2.0, (0.0, 0.0, 0.0, 0.0), 0.0, 1.0, 4.0, 3.0))
    after = server_metrics.parse_exposition(_exposition(5.0, (10.0, 30.0, 40.0, 40.0), 9.0, 3.0, 8.0, 1.0))
    assert after['higgs_serve_stage0_steps_total{mode="full"}'] == 12.0  # the named series read as before
    series = server_metrics.playback_series(before, after)
    assert set(series) == {'higgs_serve_stream_stalls_total{reason="late"}', 'higgs_serve_stream_slack_seconds{stage="0"}',
                           "higgs_serve_queue_wait_seconds", "higgs_serve_admission_waiting"}  # not queue_depth
    assert series['higgs_serve_stream_stalls_total{reason="late"}'] == 3.0  # a counter: its growth
    assert series["higgs_serve_admission_waiting"] == 1.0  # a gauge: its value at the end
    slack = series['higgs_serve_stream_slack_seconds{stage="0"}']
    # 40 observations: 10 under 0.1 s, 20 in (0.1, 0.5], 10 in (0.5, 1.0]
    assert slack["count"] == 40 and slack["mean"] == pytest.approx(9.0 / 40)
    assert slack["p50"] == pytest.approx(0.1 + 0.4 * (20 - 10) / 20) and slack["p95"] == pytest.approx(0.5 + 0.5 * 8 / 10)
    wait = series["higgs_serve_queue_wait_seconds"]
    assert (wait["count"], wait["mean"], wait["p50"]) == (4.0, 0.5, None)  # no buckets: no quantiles
    assert server_metrics.playback_series(server_metrics.Scrape(), server_metrics.Scrape()) == {}


def test_bucket_quantile_follows_prometheus():
    q = server_metrics.bucket_quantile
    assert q([(1.0, 5.0), (2.0, 10.0), (float("inf"), 10.0)], 0.5) == pytest.approx(1.0)
    assert q([(1.0, 0.0), (2.0, 10.0), (float("inf"), 10.0)], 0.5) == pytest.approx(1.5)
    assert q([(1.0, 0.0), (float("inf"), 4.0)], 0.9) == 1.0  # in the +Inf bucket: the highest finite bound
    assert q([], 0.5) is None and q([(1.0, 0.0), (float("inf"), 0.0)], 0.5) is None


# ------------------------------------------------------------------------------ request bodies
def test_request_body_asks_for_exactly_n_streamed_pcm_frames():
    args = bench_serving.parse_args(["--model", "m", "--frames", "40", "--seed", "7"])
    body = stream_client.request_body(3, args)
    assert body["stream"] is True and body["stream_format"] == "audio" and body["response_format"] == "pcm"
    assert body["max_new_tokens"] == body["min_new_tokens"] == 40
    assert body["seed"] == 10 and body["input"] == stream_client.SENTENCES[3]


def test_file_every_mixes_whole_file_requests_into_the_streams():
    args = bench_serving.parse_args(["--model", "m", "--file-every", "4"])
    assert [stream_client.request_body(i, args)["stream"] for i in range(8)] == [True, True, True, False] * 2
    assert "stream_format" not in stream_client.request_body(3, args)  # the server refuses it on a file
    rec = stream_client.RequestRecord
    n = 25 * stream_client.FRAME_SAMPLES * 2  # 1 s of audio
    stream = rec(index=0, sent=0.0, frames=25, status=200, first_audio=0.1, end=0.5, num_bytes=n, arrivals=[(0.1, n)])
    whole = rec(index=3, sent=0.0, frames=25, streamed=False, status=200, first_audio=0.9, end=1.0, num_bytes=n,
                arrivals=[(0.9, n)])
    m = bench_serving.level_metrics(2, [stream, whole], window_s=1.0)
    assert m["ttfa_ms_p50"] == pytest.approx(100.0)  # the stream's only: a file's first byte is its end
    assert (m["file_requests"], m["file_latency_s_p50"]) == (1, pytest.approx(1.0))
    assert m["audio_s_total"] == pytest.approx(2.0) and m["completed"] == 2
    assert m["goodput_share"] == 1.0  # of the streamed requests only


def test_frames_spread_draws_repeatable_lengths_around_frames():
    args = bench_serving.parse_args(["--model", "m", "--frames", "200", "--frames-spread", "0.5"])
    lengths = [stream_client.request_frames(i, args) for i in range(200)]
    assert lengths == [stream_client.request_frames(i, args) for i in range(200)]  # seeded per request
    assert 100 <= min(lengths) < 120 and 280 < max(lengths) <= 300 and len(set(lengths)) > 100
    body = stream_client.request_body(5, args)
    assert body["max_new_tokens"] == body["min_new_tokens"] == lengths[5]
    with pytest.raises(SystemExit):
        bench_serving.parse_args(["--model", "m", "--frames-spread", "1.0"])
