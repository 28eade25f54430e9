"""Stage 1 scheduling: per-request order, shortest windows first, batches capped, each window's
own frames cut out of its batch's decode, and windows of streams far ahead waiting for company."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from higgs_serve.codec.chunker import WindowShape
from higgs_serve.codec.codec_graphs import graph_batch_sizes
from higgs_serve.codec.codec_runner import (PLAYBACK_MARGIN_S, CodecJob, CodecRunner, PlaybackClock, batch_shape,
                                            next_batch)


def _job(request_id: str, frames: int, log: list | None = None, trim_front: int = 0) -> CodecJob:
    def deliver(job, audio, error=None):
        assert error is None
        log.append((job.request_id, len(job.frames), audio))

    return CodecJob(request_id, np.full((frames, 8), frames % 1024, dtype=np.int64), trim_front, 0,
                    is_final=False, deliver=deliver)


def test_next_batch_takes_each_requests_oldest_window_shortest_first():
    a_long, a_final = _job("a", 54), _job("a", 10)
    b_first, c_first = _job("b", 5), _job("c", 5)
    pending = [a_long, a_final, b_first, c_first]
    assert next_batch(pending, 8) == [b_first, c_first]  # first chunks jump the queue
    pending = [a_long, a_final]
    assert next_batch(pending, 8) == [a_long]  # a's final waits for a's earlier window
    assert next_batch([a_final], 8) == [a_final]


def test_next_batch_caps_the_batch():
    jobs = [_job(str(i), 54) for i in range(10)]
    assert next_batch(jobs, 4) == jobs[:4]


class _Echo(torch.nn.Module):
    """A stand-in decoder: frame t of window row b becomes 960 samples equal to its code 0; with
    `keep`, only the kept frames' samples, as the real decoder returns them."""

    def forward(self, codes: torch.Tensor, keep: tuple[int, int] | None = None) -> torch.Tensor:
        first, end = keep or (0, codes.shape[1])
        return codes[:, first:end, 0].float().repeat_interleave(960, dim=1)  # [B, kept * 960]


def test_runner_delivers_each_requests_chunks_in_order():
    log: list = []
    runner = CodecRunner(_Echo(), torch.device("cpu"), max_batch_windows=2, samples_per_frame=960)
    jobs = [_job("a", 54, log, trim_front=25), _job("a", 30, log), _job("b", 5, log), _job("a", 7, log),
            _job("b", 54, log), _job("c", 5, log)]
    runner.start()
    try:
        for job in jobs:
            runner.submit(job)
    finally:
        runner.stop()  # decodes everything still queued before it returns
    assert len(log) == len(jobs)
    order = {rid: [n for r, n, _ in log if r == rid] for rid in "abc"}
    assert order == {"a": [54, 30, 7], "b": [5, 54], "c": [5]}
    for rid, frames, audio in log:
        trim = 25 if (rid, frames) == ("a", 54) else 0
        assert len(audio) == (frames - trim) * 960
        assert np.all(audio == frames % 1024)


def test_a_batch_decodes_the_union_of_its_windows_kept_frames_and_each_gets_its_own():
    log: list = []

    def deliver(job, audio, error=None):
        assert error is None
        log.append((job.request_id, audio))

    frames = np.repeat(np.arange(39, dtype=np.int64)[:, None], 8, axis=1)  # frame t's codes are t
    steady = CodecJob("a", frames, 10, 4, False, deliver)  # keeps frames 10-34
    final = CodecJob("b", frames, 12, 0, True, deliver)  # keeps frames 12-38
    assert batch_shape([steady, final]) == WindowShape(39, 10, 39)
    runner = CodecRunner(_Echo(), torch.device("cpu"), max_batch_windows=4, samples_per_frame=960)
    runner._decode_and_deliver([steady, final])
    got = {rid: audio[::960].astype(int).tolist() for rid, audio in log}
    assert got == {"a": list(range(10, 35)), "b": list(range(12, 39))}


class _Broken(torch.nn.Module):
    def forward(self, codes: torch.Tensor, keep: tuple[int, int] | None = None) -> torch.Tensor:
        raise RuntimeError("decoder exploded")


def test_a_failed_decode_fails_its_requests_and_the_stage_keeps_running():
    log: list = []
    errors: list = []

    def deliver(job, audio, error=None):
        (errors if error is not None else log).append(job.request_id)

    runner = CodecRunner(_Broken(), torch.device("cpu"), max_batch_windows=4, samples_per_frame=960)
    runner.start()
    try:
        runner.submit(CodecJob("a", np.zeros((5, 8), np.int64), 0, 0, False, deliver))
        runner.submit(CodecJob("b", np.zeros((0, 8), np.int64), 0, 0, True, deliver))  # empty final: no decode
    finally:
        runner.stop()
    assert errors == ["a"] and log == ["b"]
    assert runner.dead_error is None


def test_cuda_graphs_fall_back_to_eager_off_cuda():
    """`cuda_graphs` (Stage 1 enforce_eager: false) is a no-op on CPU: nothing is captured and
    every batch decodes eagerly."""
    runner = CodecRunner(_Echo(), torch.device("cpu"), max_batch_windows=2, samples_per_frame=960, cuda_graphs=True)
    assert runner.cuda_graphs is False
    assert runner.warm_up((WindowShape(5, 0, 1), WindowShape(54, 25, 50)), num_codebooks=8) == 0.0
    assert runner.graphs is None
    frames = np.stack([np.full((5, 8), 3, dtype=np.int64)] * 2)
    audio = runner.decode_batch(frames)
    assert audio.shape == (2, 5 * 960) and audio.dtype == np.float32 and np.all(audio == 3)


# ------------------------------------------------------------------ waiting for company


def _timed_job(request_id: str, frames: int, log: list, clock=None, is_final: bool = False) -> CodecJob:
    def deliver(job, audio, error=None):
        assert error is None
        log.append((job.request_id, time.monotonic()))

    return CodecJob(request_id, np.zeros((frames, 8), np.int64), 0, 0, is_final, deliver, clock=clock)


def _ahead(seconds: float) -> PlaybackClock:
    """A listener with `seconds` of audio still to play."""
    clock = PlaybackClock()
    clock.played(seconds, time.monotonic())
    return clock


def test_playback_clock_pauses_when_the_listener_has_nothing():
    clock = PlaybackClock()
    assert clock.lead_s(100.0) < 0  # nothing played yet: no lead
    clock.played(1.0, now=100.0)
    assert clock.lead_s(100.5) == pytest.approx(0.5)
    clock.played(1.0, now=100.5)  # delivered while still playing: queued behind
    assert clock.runs_dry_at == pytest.approx(102.0)
    clock.played(0.2, now=105.0)  # ran dry at 102, then paused: starts again now
    assert clock.runs_dry_at == pytest.approx(105.2)


def test_next_batch_lets_waiting_windows_wait_unless_their_length_is_full_or_due():
    held = {"a", "b", "c"}
    waiting = lambda job: job.request_id in held  # noqa: E731
    a, b, c, d = _job("a", 39), _job("b", 39), _job("c", 39), _job("d", 30)
    assert next_batch([a, b], 4, waiting) == []  # nothing due, no full batch
    assert next_batch([a, b, c], 3, waiting) == [a, b, c]  # a full batch goes
    assert next_batch([a, b, d], 4, waiting) == [d]  # the due length goes alone
    e = _job("e", 39)  # due: the held windows of its length ride along, the due one first
    assert next_batch([a, b, e, d], 2, waiting) == [d]  # shortest ready length first
    assert next_batch([a, b, e], 2, waiting) == [e, a]


def test_a_window_of_a_stream_far_ahead_waits_for_company():
    log: list = []
    runner = CodecRunner(_Echo(), torch.device("cpu"), max_batch_windows=3, samples_per_frame=960, max_wait_s=30.0)
    runner.start()
    try:
        for rid in "abc":
            runner.submit(_timed_job(rid, 39, log, clock=_ahead(60.0)))
            time.sleep(0.02)
        deadline = time.monotonic() + 10
        while len(log) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        runner.stop()
    assert sorted(r for r, _ in log) == ["a", "b", "c"]
    assert (runner.counters.calls, runner.counters.windows) == (1, 3)  # one call, once the batch was full


def test_a_held_window_decodes_alone_after_max_wait():
    log: list = []
    runner = CodecRunner(_Echo(), torch.device("cpu"), max_batch_windows=8, samples_per_frame=960, max_wait_s=0.2)
    runner.start()
    try:
        t0 = time.monotonic()
        runner.submit(_timed_job("a", 39, log, clock=_ahead(60.0)))
        while not log and time.monotonic() < t0 + 10:
            time.sleep(0.01)
    finally:
        runner.stop()
    assert len(log) == 1 and 0.2 <= log[0][1] - t0 < 5.0


@pytest.mark.parametrize("clock, is_final", [
    (None, False),  # not streamed
    ("new", False),  # no audio sent yet: the first chunk
    ("close", False),  # the listener is about to run dry
    ("far", True),  # a final window: the request's end waits on it
], ids=["unstreamed", "first_chunk", "little_lead", "final"])
def test_windows_that_never_wait(clock, is_final):
    clock = {None: None, "new": PlaybackClock(), "close": _ahead(PLAYBACK_MARGIN_S / 2), "far": _ahead(60.0)}[clock]
    log: list = []
    runner = CodecRunner(_Echo(), torch.device("cpu"), max_batch_windows=8, samples_per_frame=960, max_wait_s=30.0)
    runner.start()
    try:
        t0 = time.monotonic()
        runner.submit(_timed_job("a", 39, log, clock=clock, is_final=is_final))
        while not log and time.monotonic() < t0 + 10:
            time.sleep(0.01)
    finally:
        runner.stop()
    assert len(log) == 1 and log[0][1] - t0 < 5.0  # long before the 30 s wait


def test_stop_decodes_held_windows_at_once():
    log: list = []
    runner = CodecRunner(_Echo(), torch.device("cpu"), max_batch_windows=8, samples_per_frame=960, max_wait_s=30.0)
    runner.start()
    runner.submit(_timed_job("a", 39, log, clock=_ahead(60.0)))
    t0 = time.monotonic()
    runner.stop()
    assert len(log) == 1 and time.monotonic() - t0 < 5.0


def test_delivered_audio_advances_the_streams_clock():
    clock = PlaybackClock()
    runner = CodecRunner(_Echo(), torch.device("cpu"), max_batch_windows=8, samples_per_frame=960)
    job = CodecJob("a", np.zeros((39, 8), np.int64), 10, 4, False, lambda *a: None, clock=clock)
    before = time.monotonic()
    runner._decode_and_deliver([job])
    assert clock.lead_s(before) >= 25 * 0.04  # the 25 kept frames
    assert (runner.counters.calls, runner.counters.windows, runner.counters.graph_calls) == (1, 1, 0)


def test_graph_batch_sizes_step_by_at_most_half_again():
    assert graph_batch_sizes(64) == (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
    assert graph_batch_sizes(16) == (1, 2, 3, 4, 6, 8, 12, 16)
    assert graph_batch_sizes(5) == (1, 2, 3, 4, 5)
    assert graph_batch_sizes(1) == (1,)
