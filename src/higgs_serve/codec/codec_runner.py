"""Stage 1: decodes codec windows of many requests in batched calls, on its own thread and stream.

Each window is a stateless decode (docs/model.md#streaming-windows), so windows of different requests with the same
length stack into one batch; the batch computes only what the frames its windows keep need.
Windows of one request are delivered in the order they were submitted. The thread never waits on
Stage 0: the talker keeps stepping while windows decode. On CUDA with `cuda_graphs`, batches of a
shape warmed up at start-up replay a captured graph of the whole decoder (`codec_graphs.py`); any
other shape decodes eagerly.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from higgs_serve.codec.chunker import WindowShape
from higgs_serve.codec.codec_graphs import CodecGraphs
from higgs_serve.codec.decoder import CodecDecoder
from higgs_serve.graph_batches import graph_batch_sizes

logger = logging.getLogger(__name__)


@dataclass
class CodecCounters:
    """Totals since start (Prometheus counters, `metrics.py`)."""

    calls: int = 0  # batched decodes
    windows: int = 0  # windows they decoded
    graph_calls: int = 0  # decodes that replayed a CUDA graph
    busy_s: float = 0.0  # wall time in decodes, host copy included
    frames: int = 0  # frames whose audio the decodes delivered (busy_s per frame: the stage's cost)


@dataclass
class CodecJob:
    request_id: str
    frames: np.ndarray  # [T, 8] int64 codes in [0, 1023]; T may be 0 for an empty final window
    trim_front_frames: int
    trim_back_frames: int
    is_final: bool
    # called on the codec thread with (job, audio [n] float32) or (job, None, error)
    deliver: Callable[..., None]
    # the first frame to decode when earlier than the first kept (a widened final window,
    # chunker.widen_final: its shape is then the same for every request)
    decode_from_frames: int | None = None
    # when the stream's listener runs out of audio (µs, the engine's clock): the earliest go
    # first; None: no deadline (a file's window), after every deadline
    deadline_us: int | None = None

    @property
    def urgency(self) -> tuple[bool, int, int]:
        """Sort key: the earliest deadline, then (and without deadlines) the shortest window."""
        return self.deadline_us is None, self.deadline_us or 0, len(self.frames)

    @property
    def decode_from(self) -> int:
        return self.trim_front_frames if self.decode_from_frames is None else self.decode_from_frames


def next_batch(pending: list[CodecJob], max_batch: int) -> list[CodecJob]:
    """The next windows to decode together, from `pending` (oldest first).

    Only each request's oldest pending window is eligible, so a request's chunks are delivered in
    order. The most urgent of those (`CodecJob.urgency`: the earliest deadline, its listener's,
    engine/deadlines/; without deadlines the shortest window, a request's first chunk) picks the
    window length; the batch is the most urgent windows of that length, at most `max_batch`, so
    the cap never holds a near-deadline window behind far ones. Batches are capped so the queue
    is looked at again often (the measured codec throughput is flat past ~16 windows per call on
    an H200).
    """
    eligible: list[CodecJob] = []
    seen: set[str] = set()
    for job in pending:
        if job.request_id not in seen:
            seen.add(job.request_id)
            eligible.append(job)
    length = len(min(eligible, key=lambda job: job.urgency).frames)
    same = [job for job in eligible if len(job.frames) == length]
    return sorted(same, key=lambda job: job.urgency)[:max_batch]


def batch_shape(batch: list[CodecJob]) -> WindowShape:
    """The frames a batch of same-length windows decodes: from the earliest any window keeps to
    the last (each job then cuts its own)."""
    frames = len(batch[0].frames)
    return WindowShape(frames, min(job.decode_from for job in batch),
                       frames - min(job.trim_back_frames for job in batch))


class CodecRunner:
    def __init__(self, decoder: CodecDecoder, device: torch.device, max_batch_windows: int, samples_per_frame: int,
                 cuda_graphs: bool = False):
        """`cuda_graphs`: capture the decoder per warmed-up shape in `warm_up` (CUDA only; the
        deploy config's Stage 1 `enforce_eager: false`)."""
        self.decoder = decoder
        self.device = device
        self.max_batch_windows = max_batch_windows
        self.samples_per_frame = samples_per_frame
        self.counters = CodecCounters()
        self._jobs: queue.SimpleQueue[CodecJob | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.cuda_graphs = cuda_graphs and self._stream is not None
        self.graphs: CodecGraphs | None = None  # captured by warm_up when cuda_graphs
        self.dead_error: BaseException | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="higgs-codec", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout=30)
            self._thread = None

    def submit(self, job: CodecJob) -> None:
        if self.dead_error is not None:
            raise RuntimeError(f"the codec stage has stopped: {self.dead_error}")
        self._jobs.put(job)

    # ------------------------------------------------------------------ thread
    def _run(self) -> None:
        pending: list[CodecJob] = []
        try:
            self._loop(pending)
        except BaseException as exc:  # never leave a request waiting for audio that cannot come
            logger.exception("codec stage died")
            self.dead_error = exc
            while True:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    pending.append(job)
            for job in pending:
                job.deliver(job, None, exc)

    def _loop(self, pending: list[CodecJob]) -> None:
        while True:
            if not pending:
                first = self._jobs.get()
                if first is None:
                    return
                pending.append(first)
            while True:  # take in whatever arrived while the last batch decoded
                try:
                    nxt = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._decode_all(pending)
                    return
                pending.append(nxt)
            self._decode_and_deliver(self._take_batch(pending))

    def _decode_all(self, pending: list[CodecJob]) -> None:
        while pending:
            self._decode_and_deliver(self._take_batch(pending))

    def _take_batch(self, pending: list[CodecJob]) -> list[CodecJob]:
        """Remove the next batch from `pending` (in place) and return it."""
        batch = next_batch(pending, self.max_batch_windows)
        taken = {id(job) for job in batch}
        pending[:] = [job for job in pending if id(job) not in taken]
        return batch

    def _decode_and_deliver(self, batch: list[CodecJob]) -> None:
        """One batched decode of same-length windows (or empty final windows); each job gets its
        audio, or the error, so a failed decode fails only the requests in it."""
        if len(batch[0].frames) == 0:
            for job in batch:
                job.deliver(job, np.zeros(0, dtype=np.float32), None)
            return
        shape = batch_shape(batch)
        t0 = time.perf_counter()
        try:
            wave = self.decode_batch(np.stack([job.frames for job in batch]), shape)
        except (RuntimeError, ValueError) as exc:
            logger.exception("codec decode of %d windows failed", len(batch))
            for job in batch:
                job.deliver(job, None, exc)
            return
        self._count(batch, time.perf_counter() - t0)
        for row, job in enumerate(batch):
            job.deliver(job, self._trim(wave[row], job, shape), None)

    def _count(self, batch: list[CodecJob], seconds: float) -> None:
        c = self.counters
        c.calls += 1
        c.windows += len(batch)
        c.frames += sum(len(job.frames) - job.trim_front_frames - job.trim_back_frames for job in batch)
        c.busy_s += seconds

    def _trim(self, wave: np.ndarray, job: CodecJob, shape: WindowShape) -> np.ndarray:
        """The job's own kept frames out of the batch's decoded range."""
        spf = self.samples_per_frame
        start = job.trim_front_frames - shape.keep_start
        end = shape.frames - job.trim_back_frames - shape.keep_start
        return wave[start * spf : end * spf]

    def warm_up(self, window_shapes: tuple[WindowShape, ...], num_codebooks: int) -> float:
        """Decode silence once for each window shape at every batch size a call can have
        (eager: 1..max_batch_windows; with `cuda_graphs`: the captured `graph_batch_sizes`),
        before traffic: a convolution's first call at a new shape builds its cuDNN plan (tens of
        ms for the whole decoder), which would otherwise stall live streams. With `cuda_graphs`,
        then capture each of those shapes (one after the other, on this thread: call it before
        `start`, after Stage 0's captures). Returns the seconds it took (0 off CUDA, where there
        is no such cost)."""
        if self.device.type != "cuda":
            return 0.0
        t0 = time.perf_counter()
        batch_sizes = (graph_batch_sizes(self.max_batch_windows) if self.cuda_graphs
                       else tuple(range(1, self.max_batch_windows + 1)))
        for shape in window_shapes:
            for batch in batch_sizes:
                self.decode_batch(np.zeros((batch, shape.frames, num_codebooks), dtype=np.int64), shape)
        if self.cuda_graphs:
            graphs = CodecGraphs(self.decoder, self.device, self._stream, num_codebooks, self.samples_per_frame)
            graphs.capture(window_shapes, batch_sizes)
            self.graphs = graphs
        seconds = time.perf_counter() - t0
        logger.info("codec warmed up for window shapes %s x batch sizes %s in %.2f s (%s)", list(window_shapes),
                    list(batch_sizes), seconds, "CUDA graphs" if self.graphs is not None else "eager")
        return seconds

    def time_batches(self, shape: WindowShape, batches: tuple[int, ...], num_codebooks: int,
                     repeats: int = 3) -> dict[int, float]:
        """{b: seconds of a call of b windows of `shape`} (the fastest of `repeats`, after one
        untimed call: a shared host only adds time), as the codec thread would run them: for the deadline policy's Stage 1
        cost, timed at start-up (engine/builder.py). Call it before `start`."""
        timed = {}
        for batch in batches:
            frames = np.zeros((batch, shape.frames, num_codebooks), dtype=np.int64)
            times = []
            for _ in range(repeats + 1):
                t0 = time.perf_counter()
                self.decode_batch(frames, shape)
                times.append(time.perf_counter() - t0)
            timed[batch] = min(times[1:])
        return timed

    @torch.inference_mode()
    def decode_batch(self, frames: np.ndarray, shape: WindowShape | None = None) -> np.ndarray:
        """frames [B, T, 8] int64 → audio [B, kept·960] float32 (host) of the frames `shape` keeps
        (all T when None)."""
        codes = torch.from_numpy(frames)
        shape = shape or WindowShape(frames.shape[1], 0, frames.shape[1])
        if self._stream is not None:
            with torch.cuda.stream(self._stream):
                if self.graphs is not None and self.graphs.serves(frames.shape[0], shape):
                    wave = self.graphs.replay(codes, shape)  # a view of the static output: copied out next
                    self.counters.graph_calls += 1
                else:
                    wave = self.decoder(codes.to(self.device, non_blocking=True), shape.keep)
                out = wave.float().cpu()
        else:
            out = self.decoder(codes.to(self.device), shape.keep).float()
        return out.numpy()
