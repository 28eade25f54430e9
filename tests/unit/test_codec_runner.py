"""Stage 1 scheduling: per-request order, the earliest deadline (else the shortest window) first,
batches capped, each window's own frames cut out of its batch's decode."""

from __future__ import annotations

import numpy as np
import torch

from higgs_serve.codec.chunker import WindowShape
from higgs_serve.graph_batches import graph_batch_sizes, padded_batch
from higgs_serve.codec.codec_runner import CodecJob, CodecRunner, batch_shape, next_batch


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


def _due(job: CodecJob, deadline_us: int | None) -> CodecJob:
    job.deadline_us = deadline_us
    return job


def test_next_batch_serves_the_earliest_deadline_first():
    """Issue 53: windows carry their listener's deadline; the earliest picks the length, the
    batch is the most urgent windows of that length, and windows without one (a file's) wait."""
    steady = [_due(_job(f"s{i}", 54), 1_000 + 100 * i) for i in range(6)]  # near their deadlines
    first = _due(_job("new", 5), 5_000)  # a new stream's first chunk, its deadline further off
    file = _due(_job("file", 5), None)
    pending = [file, first] + steady[::-1]
    assert next_batch(pending, 8) == steady  # in deadline order, though queued last
    assert next_batch(pending, 4) == steady[:4]  # the cap keeps the nearest, not the oldest
    assert next_batch([file, first], 8) == [first, file]  # a deadline before none (same length)
    assert next_batch([file, first], 1) == [first]
    late_first = _due(_job("late", 5), 500)
    assert next_batch(pending + [late_first], 8) == [late_first, first, file]  # its length's batch
    a_long, a_next = _due(_job("a", 54), 10_000), _due(_job("a", 10), 0)
    assert next_batch([a_long, a_next], 8) == [a_long]  # a request's windows stay in order


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


def test_counters_count_calls_and_windows():
    runner = CodecRunner(_Echo(), torch.device("cpu"), max_batch_windows=8, samples_per_frame=960)
    runner._decode_and_deliver([_job("a", 39, []), _job("b", 39, [])])
    runner._decode_and_deliver([_job("c", 5, [])])
    c = runner.counters
    assert (c.calls, c.windows, c.graph_calls) == (2, 3, 0) and c.busy_s > 0  # CPU: eager


def test_graph_batch_sizes_step_by_at_most_half_again():
    assert graph_batch_sizes(64) == (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
    assert graph_batch_sizes(16) == (1, 2, 3, 4, 6, 8, 12, 16)
    assert graph_batch_sizes(5) == (1, 2, 3, 4, 5)
    assert graph_batch_sizes(1) == (1,)


def test_a_batch_replays_the_smallest_captured_size_that_holds_it():
    sizes = list(graph_batch_sizes(16))
    assert [padded_batch(sizes, b) for b in range(1, 18)] == [1, 2, 3, 4, 6, 6, 8, 8, 12, 12, 12, 12, 16, 16, 16, 16, None]
    assert padded_batch([], 1) is None


def test_widened_final_windows_of_different_lengths_share_one_shape():
    """Two final windows of 3 and 20 new frames, widened to 39 frames decoded from frame 10
    (chunker.widen_final): one batch of shape (39, 10, 39), each job cut to its own frames."""
    log: list = []

    def deliver(job, audio, error=None):
        assert error is None
        log.append((job.request_id, audio))

    frames = np.repeat(np.arange(39, dtype=np.int64)[:, None], 8, axis=1)  # frame t's codes are t
    short = CodecJob("a", frames, 36, 0, True, deliver, decode_from_frames=10)
    long = CodecJob("b", frames, 19, 0, True, deliver, decode_from_frames=10)
    assert batch_shape([short, long]) == WindowShape(39, 10, 39)
    runner = CodecRunner(_Echo(), torch.device("cpu"), max_batch_windows=4, samples_per_frame=960)
    runner._decode_and_deliver([short, long])
    got = {rid: audio[::960].astype(int).tolist() for rid, audio in log}
    assert got == {"a": [36, 37, 38], "b": list(range(19, 39))}
